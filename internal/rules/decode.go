package rules

import (
	"fmt"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Decoding a rule file. Every value of the file decodes itself with its
// UnmarshalYAML method: the scalars of values.go check their own input,
// and the file, descriptors, limits and their lists (config.go) decode
// their keys with decodeMapping, then check how the keys combine. They
// report every problem, not just the first: a value that holds others
// returns all the problems found in it, as problems, and the file's
// problems become the errors of Parse.
//
// A problem is hard when the value it is about cannot be used, and soft
// when decoding went on without it: an unknown key is skipped, a
// shadow_mode that is not a boolean is false. A value with a hard problem is left out
// (a limit with a bad unit is not built, nor checked against its
// siblings); how far that reaches is up to what holds it.

// A problem is one error of a rule file, at a line and the path of a key
// ("descriptors[1].rate_limit.unit"; empty for the file as a whole).
type problem struct {
	line int
	key  string
	err  error
	soft bool // the value it is about is still used
}

// problems are the problems of a value, in file order. It is the error
// the UnmarshalYAML methods of the values that hold others return; nil
// when there is none.
type problems []problem

func (ps problems) Error() string {
	msgs := make([]string, len(ps))
	for i, pr := range ps {
		if pr.key == "" {
			msgs[i] = fmt.Sprintf("line %d: %v", pr.line, pr.err)
		} else {
			msgs[i] = fmt.Sprintf("line %d: %s: %v", pr.line, pr.key, pr.err)
		}
	}
	return strings.Join(msgs, "\n")
}

// err returns ps as an error: nil when it is empty.
func (ps problems) err() error {
	if len(ps) == 0 {
		return nil
	}
	return ps
}

// hard reports whether a problem of ps makes its value unusable.
func (ps problems) hard() bool {
	for _, pr := range ps {
		if !pr.soft {
			return true
		}
	}
	return false
}

// soften returns ps as the error of a list that left out the items they
// are about: what holds the list is still usable.
func (ps problems) soften() error {
	for i := range ps {
		ps[i].soft = true
	}
	return ps.err()
}

// errorf records a hard problem at node n.
func (ps *problems) errorf(n *yaml.Node, key, format string, a ...any) {
	*ps = append(*ps, problem{line: n.Line, key: key, err: fmt.Errorf(format, a...)})
}

// softf records a soft problem at node n.
func (ps *problems) softf(n *yaml.Node, key, format string, a ...any) {
	*ps = append(*ps, problem{line: n.Line, key: key, err: fmt.Errorf(format, a...), soft: true})
}

// add records err, what the UnmarshalYAML of the value v at path key
// returned; k is the key node of v, nil for an item of a list. It reports
// whether v is unusable. An error other than problems is a problem at v,
// hard unless marked soft, and at k if marked atKey.
func (ps *problems) add(k, v *yaml.Node, key string, err error) (failed bool) {
	pr := problem{line: v.Line, key: key, err: err}
	switch e := err.(type) {
	case nil:
		return false
	case problems:
		*ps = append(*ps, e...)
		return e.hard()
	case *hint:
		pr.err, pr.soft = e.err, e.soft
		if e.atKey && k != nil {
			pr.line = k.Line
		}
	}
	*ps = append(*ps, pr)
	return !pr.soft
}

// A hint wraps the error of a scalar's UnmarshalYAML to say how to report
// it (see atKey and soft).
type hint struct {
	err   error
	atKey bool
	soft  bool
}

func (h *hint) Error() string { return h.err.Error() }
func (h *hint) Unwrap() error { return h.err }

// atKey marks err, unless nil, to be reported at the value's key rather
// than at the value: it is about what the key names.
func atKey(err error) error {
	if err == nil {
		return nil
	}
	return &hint{err: err, atKey: true}
}

// soft marks err as a soft problem: the value was taken as its zero.
func soft(err error) error { return &hint{err: err, soft: true} }

// A field is a key a mapping accepts and the value it decodes into.
type field struct {
	name  string
	value yaml.Unmarshaler
}

// A pair is a key given in a mapping, with its value (aliases followed),
// for the checks that look at which keys were given and for errors that
// point at a key.
type pair struct {
	name       string
	key, value *yaml.Node
	failed     bool // the value had a hard problem
}

type pairs []pair

// get returns the pair of the key name, or nil when it was not given.
func (ps pairs) get(name string) *pair {
	for i := range ps {
		if ps[i].name == name {
			return &ps[i]
		}
	}
	return nil
}

// decodeMapping decodes the mapping n, at path, into fields, and returns
// the keys given, in file order. A key that is not a string, a merge key
// (<<), a duplicate key or one that is not among fields is reported and
// skipped; each other key's value is decoded by its field.
func decodeMapping(n *yaml.Node, path string, fields []field, ps *problems) pairs {
	given := make(pairs, 0, len(n.Content)/2)
	seen := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), resolve(n.Content[i+1])
		if k.Kind != yaml.ScalarNode || k.ShortTag() == "!!null" {
			ps.softf(k, path, "a key must be a string, got %s", describe(k))
			continue
		}
		if k.ShortTag() == "!!merge" {
			ps.softf(k, path, "merge keys (<<) are not supported; repeat the keys or use an alias for the whole block")
			continue
		}
		name := k.Value
		if line, dup := seen[name]; dup {
			ps.softf(k, join(path, name), "duplicate key %q (first at line %d)", name, line)
			continue
		}
		seen[name] = k.Line
		f := findField(fields, name)
		if f == nil {
			ps.softf(k, join(path, name), "unknown key %q (want one of %s)", name, fieldNames(fields))
			continue
		}
		failed := false
		if err := f.value.UnmarshalYAML(v); err != nil {
			failed = ps.add(k, v, join(path, name), err)
		}
		given = append(given, pair{name: name, key: k, value: v, failed: failed})
	}
	return given
}

func findField(fields []field, name string) *field {
	for i := range fields {
		if fields[i].name == name {
			return &fields[i]
		}
	}
	return nil
}

func fieldNames(fields []field) string {
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = f.name
	}
	return strings.Join(names, ", ")
}

// decodeList returns the items of the list n at path. Null is an empty
// list; anything else that is not a list is reported and taken as one.
func decodeList(n *yaml.Node, path string, ps *problems) []*yaml.Node {
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		ps.softf(n, path, "want a list, got %s", describe(n))
		return nil
	}
	return n.Content
}

// decodeItem decodes item, at path, into v, and reports whether v can be
// used.
func decodeItem(item *yaml.Node, path string, v yaml.Unmarshaler, ps *problems) bool {
	item = resolve(item)
	return !ps.add(nil, item, path, v.UnmarshalYAML(item))
}

// resolve follows aliases.
func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 100; i++ {
		n = n.Alias
	}
	if n == nil || n.Kind == yaml.AliasNode {
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null"}
	}
	return n
}

// describe names the kind of a node for errors.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "null"
		case "!!str":
			return strconv.Quote(n.Value)
		case "!!int", "!!float":
			return "the number " + n.Value
		case "!!bool":
			return "the boolean " + n.Value
		}
		return n.ShortTag() + " " + strconv.Quote(n.Value)
	}
	return "an empty document"
}

// join returns the path of key in the mapping at path.
func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// index returns the path of item i of the list at path.
func index(path string, i int) string {
	return path + "[" + strconv.Itoa(i) + "]"
}
