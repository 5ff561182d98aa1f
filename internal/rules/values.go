package rules

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/ratelimit"
)

// The scalar values of a rule file. Each type decodes one kind of value
// and rejects what is not one, with the message `sluice rules validate`
// prints; the mapping that holds the value adds the line and the key (see
// decodeMapping). They are conversions of the types the decoded structs
// hold, as in (*unitName)(&l.Unit), so the structs keep their plain types.

// decodeString returns the text of a scalar. Numbers and booleans are taken
// as written (value: 30 is the string "30"), as envoyproxy/ratelimit does.
func decodeString(n *yaml.Node) (string, error) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" {
		return "", fmt.Errorf("want a string, got %s", describe(n))
	}
	return n.Value, nil
}

// text is any string: the domain, the name a replaces entry gives.
type text string

func (t *text) UnmarshalYAML(n *yaml.Node) error {
	s, err := decodeString(n)
	*t = text(s)
	return err
}

// descriptorKey is the key of a descriptor: not empty, at most
// MaxKeyValueBytes. What is wrong with a key string is reported at the
// key: of the descriptor.
type descriptorKey string

func (k *descriptorKey) UnmarshalYAML(n *yaml.Node) error {
	s, err := decodeString(n)
	if err != nil {
		return err
	}
	*k = descriptorKey(s)
	if s == "" {
		return atKey(errors.New("descriptor has empty key"))
	}
	return atKey(checkLength("key", s))
}

// descriptorValue is the value of a descriptor: at most MaxKeyValueBytes,
// reported at the value: key, like a descriptorKey. It is kept even when
// too long, for the checks that look at it (share_threshold).
type descriptorValue string

func (v *descriptorValue) UnmarshalYAML(n *yaml.Node) error {
	s, err := decodeString(n)
	if err != nil {
		return err
	}
	*v = descriptorValue(s)
	return atKey(checkLength("value", s))
}

// checkLength checks that s, the named string of a file, is within
// MaxKeyValueBytes.
func checkLength(name, s string) error {
	if len(s) > MaxKeyValueBytes {
		return fmt.Errorf("%s is %d bytes; the bound is %d (MaxKeyValueBytes)", name, len(s), MaxKeyValueBytes)
	}
	return nil
}

// ruleName is the name a limit gives its rule: not empty, since leaving
// the name out is how to have one generated.
type ruleName string

func (r *ruleName) UnmarshalYAML(n *yaml.Node) error {
	s, err := decodeString(n)
	if err != nil {
		return err
	}
	if s == "" {
		return errors.New("empty name; remove the key to have one generated")
	}
	*r = ruleName(s)
	return nil
}

// boolean is true or false, in any case. Anything else is reported and
// taken as false: the mapping holding it is still checked and used.
type boolean bool

func (b *boolean) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!bool" {
		// A tag makes a !!bool of any text, as in "!!bool yes".
		if v, err := strconv.ParseBool(strings.ToLower(n.Value)); err == nil {
			*b = boolean(v)
			return nil
		}
	}
	return soft(fmt.Errorf("want true or false, got %s", describe(n)))
}

// quota is a requests_per_unit: 0 to ratelimit.MaxQuota.
type quota int64

func (q *quota) UnmarshalYAML(n *yaml.Node) error {
	v, err := decodeCount(n, "requests_per_unit", 0, "is negative")
	*q = quota(v)
	return err
}

// burst is the burst of a gcra or leaky_bucket limit: 1 to
// ratelimit.MaxQuota, since leaving it out is how to mean
// requests_per_unit.
type burst int64

func (b *burst) UnmarshalYAML(n *yaml.Node) error {
	v, err := decodeCount(n, "burst", 1, "must be at least 1 (omit it to mean requests_per_unit)")
	*b = burst(v)
	return err
}

// decodeCount decodes the integer of key name, which must be at least lo
// (else the error says "<name> <value> <below>") and at most
// ratelimit.MaxQuota.
func decodeCount(n *yaml.Node, name string, lo int64, below string) (int64, error) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		return 0, fmt.Errorf("want an integer, got %s", describe(n))
	}
	var v int64
	if err := n.Decode(&v); err != nil {
		return 0, fmt.Errorf("integer %s out of range", n.Value)
	}
	switch {
	case v < lo:
		return 0, fmt.Errorf("%s %d %s", name, v, below)
	case v > ratelimit.MaxQuota:
		return 0, fmt.Errorf("%s %d exceeds %d", name, v, int64(ratelimit.MaxQuota))
	}
	return v, nil
}

// unitName is an envoy unit, named in any case.
type unitName Unit

func (u *unitName) UnmarshalYAML(n *yaml.Node) error {
	s, err := decodeString(n)
	if err != nil {
		return err
	}
	unit, ok := parseUnit(s)
	if !ok {
		return fmt.Errorf("invalid unit %q (want second, minute, hour, day, week, month or year)", s)
	}
	*u = unitName(unit)
	return nil
}

// costUnit is the cost_unit of a limit: a name CheckCostUnit accepts.
type costUnit string

func (u *costUnit) UnmarshalYAML(n *yaml.Node) error {
	s, err := decodeString(n)
	if err != nil {
		return err
	}
	if err := CheckCostUnit(s); err != nil {
		return err
	}
	*u = costUnit(s)
	return nil
}

// period is a window given as a Go duration: positive, at most
// ratelimit.MaxPeriod.
type period time.Duration

func (p *period) UnmarshalYAML(n *yaml.Node) error {
	s, err := decodeString(n)
	if err != nil {
		return err
	}
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return fmt.Errorf("invalid period %q: want a Go duration such as 1s, 90s or 1h30m", s)
	case d <= 0:
		return fmt.Errorf("period %s must be positive", s)
	case d > ratelimit.MaxPeriod:
		return fmt.Errorf("period %s exceeds %v", s, ratelimit.MaxPeriod)
	}
	*p = period(d)
	return nil
}

// algorithmName is a ratelimit.Algorithm, by its name.
type algorithmName ratelimit.Algorithm

func (a *algorithmName) UnmarshalYAML(n *yaml.Node) error {
	s, err := decodeString(n)
	if err != nil {
		return err
	}
	alg, err := ratelimit.ParseAlgorithm(s)
	if err != nil {
		return fmt.Errorf("invalid algorithm %q (want gcra, fixed_window, sliding_log, sliding_window or leaky_bucket)", s)
	}
	*a = algorithmName(alg)
	return nil
}

// failureMode is a ratelimit.FailureMode, by its name.
type failureMode ratelimit.FailureMode

func (f *failureMode) UnmarshalYAML(n *yaml.Node) error {
	s, err := decodeString(n)
	if err != nil {
		return err
	}
	mode, err := ratelimit.ParseFailureMode(s)
	if err != nil {
		return fmt.Errorf("invalid failure_mode %q (want fail_open, fail_closed or local)", s)
	}
	*f = failureMode(mode)
	return nil
}

// counting is a ratelimit.Counting, by its name.
type counting ratelimit.Counting

func (c *counting) UnmarshalYAML(n *yaml.Node) error {
	s, err := decodeString(n)
	if err != nil {
		return err
	}
	mode, err := ratelimit.ParseCounting(s)
	if err != nil {
		return fmt.Errorf("invalid counting %q (want strict, batched or approximate)", s)
	}
	*c = counting(mode)
	return nil
}

// countingAlgorithms says, for an error, which algorithms each mode takes
// (ratelimit.Counting.Supports).
var countingAlgorithms = map[ratelimit.Counting]string{
	ratelimit.Batched:     "batched takes gcra, fixed_window and leaky_bucket",
	ratelimit.Approximate: "approximate takes gcra and leaky_bucket",
}

// timezone decodes the IANA name of a zone into *loc. "Local" is not one:
// it would make a rule mean something else on every host.
type timezone struct{ loc **time.Location }

func (tz timezone) UnmarshalYAML(n *yaml.Node) error {
	s, err := decodeString(n)
	if err != nil {
		return err
	}
	if s == "" || s == "Local" {
		return fmt.Errorf("invalid timezone %q: name an IANA zone such as Europe/Paris or UTC", s)
	}
	loc, err := time.LoadLocation(s)
	if err != nil {
		return fmt.Errorf("unknown timezone %q (want an IANA zone such as Europe/Paris)", s)
	}
	*tz.loc = loc
	return nil
}

// refused is a key envoyproxy/ratelimit reads that Sluice does not act
// on: any value is refused, at its key, with a message saying so, rather
// than accepted and silently ignored.
type refused struct{ why string }

func (r refused) UnmarshalYAML(*yaml.Node) error {
	return &hint{err: errors.New(r.why), atKey: true, soft: true}
}
