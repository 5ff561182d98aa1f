package rules

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// Bounds on rule files. Files beyond them are rejected with an error that
// names the bound.
const (
	// MaxFileBytes bounds the size of one rule file.
	MaxFileBytes = 1 << 20
	// MaxFiles bounds the number of rule files Load reads from a directory.
	MaxFiles = 1000
	// MaxDepth bounds the nesting of descriptors. A request descriptor has
	// at most MaxEntries entries, so a deeper rule could never match.
	MaxDepth = MaxEntries
	// MaxDescriptorsPerDomain bounds the descriptors (at every level,
	// aliases expanded) of one domain.
	MaxDescriptorsPerDomain = 10000
	// MaxLimitsPerDescriptor bounds the limits of one descriptor.
	MaxLimitsPerDescriptor = 8
	// MaxCostUnitBytes bounds the name of a cost unit (see CheckCostUnit).
	MaxCostUnitBytes = 32
	// MaxCostUnits bounds the cost units one request descriptor gives
	// costs for: as many as the limits one descriptor can have.
	MaxCostUnits = MaxLimitsPerDescriptor
	// maxErrorsPerFile bounds the errors reported for one file.
	maxErrorsPerFile = 100
)

// Unit is a time unit of envoyproxy/ratelimit's rule files. Its values are
// those of the RLS v3 proto enum RateLimitResponse.RateLimit.Unit, so an
// adapter converts it with a plain conversion.
type Unit uint8

const (
	// UnitUnknown is the Unit of a limit given with a period that is not
	// exactly one unit long, and of unlimited rules.
	UnitUnknown Unit = iota
	Second
	Minute
	Hour
	Day
	Month
	Year
	Week

	numUnits
)

var unitNames = [numUnits]string{"unknown", "second", "minute", "hour", "day", "month", "year", "week"}

// unitLengths are the windows envoyproxy/ratelimit gives each unit:
// a month is 30 days and a year 365 days.
var unitLengths = [numUnits]time.Duration{
	0, time.Second, time.Minute, time.Hour, 24 * time.Hour,
	30 * 24 * time.Hour, 365 * 24 * time.Hour, 7 * 24 * time.Hour,
}

func (u Unit) String() string {
	if u < numUnits {
		return unitNames[u]
	}
	return fmt.Sprintf("Unit(%d)", uint8(u))
}

// Duration is the length envoyproxy/ratelimit gives a window of u (week 7
// days, month 30 days, year 365 days), or 0 for UnitUnknown.
func (u Unit) Duration() time.Duration {
	if u < numUnits {
		return unitLengths[u]
	}
	return 0
}

// parseUnit accepts the unit names in any case, as envoyproxy/ratelimit does.
func parseUnit(s string) (Unit, bool) {
	for i := Second; i < numUnits; i++ {
		if strings.EqualFold(unitNames[i], s) {
			return i, true
		}
	}
	return UnitUnknown, false
}

// CheckCostUnit reports whether name is a valid cost unit: 1 to
// MaxCostUnitBytes bytes of a-z, 0-9 and _ ("input_tokens", "ru"). Rule
// files and requests name the units with it.
func CheckCostUnit(name string) error {
	if name == "" {
		return errors.New("empty cost unit")
	}
	if len(name) > MaxCostUnitBytes {
		return fmt.Errorf("cost unit is %d bytes; the bound is %d (MaxCostUnitBytes)", len(name), MaxCostUnitBytes)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return fmt.Errorf("invalid cost unit %q: want a-z, 0-9 and _ only", name)
		}
	}
	return nil
}

// An Entry is one key/value pair of a request descriptor.
type Entry struct {
	Key, Value string
}

// A Spec is one configured limit: immutable, shared by every request it
// matches for the life of its Set. Its fields must not be modified.
type Spec struct {
	// Rule is what a Store decides with; nil when Unlimited. It passed
	// Rule.Validate. Its address is stable for the life of the Set, so it
	// may key caches.
	Rule *ratelimit.Rule
	// Name is the rule's `name`, or a stable generated one: the domain,
	// the descriptor path as envoyproxy/ratelimit writes it in stats
	// (key or key_value, joined by dots) and the window, e.g.
	// "edge.remote_address.second" or "api.tenant.user.calendar_month".
	Name string
	// Domain is the domain the rule belongs to.
	Domain string
	// Source is "file:line" of the limit in its rule file.
	Source string
	// Unit is the envoy unit of the limit, for RLS responses; UnitUnknown
	// when the limit was given as a period that is not one unit long, and
	// for unlimited rules.
	Unit Unit
	// CostUnit is what the limit counts (its cost_unit: "input_tokens"),
	// a name CheckCostUnit accepts; empty for a limit that counts the
	// descriptor's cost, whatever it stands for. A request that gives
	// costs per unit takes this unit's from this limit (the service's
	// Descriptor.Costs).
	CostUnit string
	// Unlimited rules match but are never counted: the answer is OK with
	// no limit (RLS: limit_remaining 2^32−1).
	Unlimited bool
	// Shadow rules are decided and counted, but the answer is always OK;
	// a denial is reported as "would deny" (descriptor's shadow_mode).
	Shadow bool
	// QuotaMode is the descriptor's quota_mode: a soft limit. Over it, the
	// descriptor's status is over the limit but the request is allowed,
	// unless every quota-mode descriptor of the request is over (or a
	// limit without quota_mode denies). This package only carries the
	// flag; the decision service acts on it (its package documentation).
	QuotaMode bool
	// DetailedMetric and ValueToMetric are the descriptor's detailed_metric
	// and value_to_metric flags. The service keeps the metrics of a Spec
	// for which PerValueMetric is true per descriptor value, named by
	// AppendMetricKey (which also reads the value_to_metric of the
	// descriptors above this one).
	DetailedMetric bool
	ValueToMetric  bool
	// Replaces lists the names of the rules this one replaces when both
	// match one request (see ApplyReplaces).
	Replaces []string

	// Storage key parts: the escaped domain, one part per level of the
	// matched path, and the tail (algorithm and window).
	domainKey string
	levels    []keyLevel
	tail      string
	perValue  bool // PerValueMetric
}

// Depth is the number of entries a request descriptor has when it matches s.
func (s *Spec) Depth() int { return len(s.levels) }

// A Match is one Spec matched by a request descriptor.
type Match struct {
	*Spec
	// Descriptor is the index of the request descriptor that matched.
	Descriptor int
}

// A Domain is the rules of one rule file: a matching tree of descriptors.
// It is immutable and safe for concurrent use.
type Domain struct {
	name  string
	file  string
	line  int // of the domain key
	root  level
	specs []*Spec // file order
}

// Name is the domain's name.
func (d *Domain) Name() string { return d.name }

// File is the path of the file the domain was loaded from.
func (d *Domain) File() string { return d.file }

// Specs returns the domain's limits in file order. The slice is shared and
// must not be modified.
func (d *Domain) Specs() []*Spec { return d.specs }

// Spec returns the domain's limit named name, or nil.
func (d *Domain) Spec(name string) *Spec {
	for _, s := range d.specs {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// A Set is an immutable snapshot of every domain loaded from a rules
// directory. It is safe for concurrent use; a reload builds a new Set and
// the service swaps the pointer. A nil *Set is an empty set.
type Set struct {
	domains map[string]*Domain
	names   []string // sorted
	files   []string // sorted
}

// NewSet returns a Set of the given domains. Two domains of one name are an
// error naming both files.
func NewSet(domains ...*Domain) (*Set, error) {
	s := &Set{domains: make(map[string]*Domain, len(domains))}
	var errs []error
	for _, d := range domains {
		if d == nil {
			continue
		}
		if prev, ok := s.domains[d.name]; ok {
			errs = append(errs, &Error{File: d.file, Line: max(d.line, 1), Key: "domain",
				Err: fmt.Errorf("duplicate domain %q (also in %s:%d)", d.name, prev.file, prev.line)})
			continue
		}
		s.domains[d.name] = d
		s.names = append(s.names, d.name)
		s.files = append(s.files, d.file)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	slices.Sort(s.names)
	slices.Sort(s.files)
	return s, nil
}

// Domain returns the domain named name, or nil and false when there is none
// (the service then answers OK with no limit, as envoyproxy/ratelimit does).
func (s *Set) Domain(name string) (*Domain, bool) {
	if s == nil {
		return nil, false
	}
	d, ok := s.domains[name]
	return d, ok
}

// ErrNoSuchDomain is returned by Set.Lookup for a domain that no rule file
// defines. The service answers such requests OK with no limit, as
// envoyproxy/ratelimit does.
var ErrNoSuchDomain = errors.New("no such domain")

// Lookup returns the domain named name, or an error wrapping
// ErrNoSuchDomain. It does not allocate when the domain exists.
func (s *Set) Lookup(name string) (*Domain, error) {
	if d, ok := s.Domain(name); ok {
		return d, nil
	}
	return nil, fmt.Errorf("rules: %w %q", ErrNoSuchDomain, name)
}

// Domains returns the names of the domains of s, sorted.
func (s *Set) Domains() []string {
	if s == nil {
		return nil
	}
	return slices.Clone(s.names)
}

// Files returns the paths of the files s was loaded from, sorted.
func (s *Set) Files() []string {
	if s == nil {
		return nil
	}
	return slices.Clone(s.files)
}

// ruleFiles lists the rule files of dir: regular files (or symlinks to
// them) named *.yaml or *.yml, not starting with a dot unless dot, sorted
// by name. Subdirectories are not read, which also skips Kubernetes
// ConfigMap internals (..data and the timestamped directories).
func ruleFiles(dir string, dot bool) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	var files []string
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".") && !dot {
			continue
		}
		if ext := filepath.Ext(name); ext != ".yaml" && ext != ".yml" {
			continue
		}
		path := filepath.Join(dir, name)
		if e.Type()&fs.ModeSymlink != 0 {
			fi, err := os.Stat(path)
			if err != nil {
				return nil, fmt.Errorf("rules: %w", err)
			}
			if !fi.Mode().IsRegular() {
				continue
			}
		} else if !e.Type().IsRegular() {
			continue
		}
		files = append(files, path)
	}
	if len(files) > MaxFiles {
		return nil, fmt.Errorf("rules: %s holds %d rule files; the bound is %d (MaxFiles)", dir, len(files), MaxFiles)
	}
	return files, nil
}

// readFile reads at most MaxFileBytes+1 bytes of path: enough for Parse
// to report a file over the bound without reading all of it.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	return data, nil
}

// Load reads every rule file of dir (see the package documentation for
// which files) and returns them as a Set. It returns every error of every
// file, joined; each names the file, the line and the key. A directory with
// no rule files gives an empty Set.
func Load(dir string) (*Set, error) {
	return LoadDir(dir, DirOptions{})
}

// DirOptions say which files of a rules directory are read.
type DirOptions struct {
	// DotFiles also reads the rule files whose names start with a dot,
	// as envoyproxy/ratelimit does unless RUNTIME_IGNOREDOTFILES is true.
	DotFiles bool
}

// LoadDir is Load with options.
func LoadDir(dir string, opts DirOptions) (*Set, error) {
	files, err := ruleFiles(dir, opts.DotFiles)
	if err != nil {
		return nil, err
	}
	return loadFiles(files)
}

// loadFiles parses files, as listed by ruleFiles, into a Set.
func loadFiles(files []string) (*Set, error) {
	var (
		errs    []error
		domains []*Domain
	)
	for _, path := range files {
		data, err := readFile(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		d, err := Parse(path, data)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		domains = append(domains, d)
	}
	s, err := NewSet(domains...)
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return s, nil
}

// Validate checks the rule files of dir as Load does, for `sluice rules
// validate`, and returns the Set they make. Unlike Load, it reports a
// directory without rule files as an error, since validating nothing is
// most likely a wrong path.
func Validate(dir string) (*Set, error) {
	files, err := ruleFiles(dir, false)
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("rules: no rule files (*.yaml, *.yml) in %s", dir)
	}
	return loadFiles(files)
}

// An Error is one problem of a rule file.
type Error struct {
	File string
	Line int
	// Key is the path of the offending key, e.g.
	// "descriptors[1].rate_limit.unit"; empty for the file as a whole.
	Key string
	Err error
}

func (e *Error) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("%s:%d: %v", e.File, e.Line, e.Err)
	}
	return fmt.Sprintf("%s:%d: %s: %v", e.File, e.Line, e.Key, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }
