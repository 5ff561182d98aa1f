package httpapi

import (
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/internal/service"
)

// fastCheck decodes body into in when it is a /v1/check body of the plain
// shape almost every caller sends, and reports whether it did: members
// named exactly as the schema spells them, each at most once, strings of
// printable ASCII without escapes, costs as integers of at most 18
// digits, at most rules.MaxCostUnits costs per object, no nulls. On such
// a body it gives what decodeCheck's encoding/json pass gives, without
// reflection; on anything else (and on every error) it reports false, and
// decodeCheck takes the general path, which explains errors. It reuses
// in's descriptors, their entries and the costs.
func fastCheck(body []byte, in *checkRequest) bool {
	p := fastParser{b: body}
	ds, cs := in.Descriptors[:0], in.Costs[:0]
	*in = checkRequest{}
	var seen [4]bool
	ok := p.object(func(name []byte) bool {
		switch string(name) {
		case "domain":
			s, ok := p.str()
			in.Domain = string(s)
			return once(&seen[0]) && ok
		case "descriptors":
			ok := p.array(func() bool {
				if len(ds) < cap(ds) {
					ds = ds[:len(ds)+1]
				} else {
					ds = append(ds, checkDescriptor{})
				}
				return p.descriptor(&ds[len(ds)-1])
			})
			in.Descriptors = ds
			return once(&seen[1]) && ok
		case "cost":
			n, ok := p.int()
			in.Cost = &n
			return once(&seen[2]) && ok
		case "costs":
			var ok bool
			in.Costs, ok = p.costs(cs)
			return once(&seen[3]) && ok
		}
		return false
	})
	return ok && seen[1] && p.ws() == len(body)
}

// once marks a member seen and reports whether it was not before.
func once(seen *bool) bool {
	if *seen {
		return false
	}
	*seen = true
	return true
}

// fastParser reads the plain JSON fastCheck accepts; every method
// reports false on anything else.
type fastParser struct {
	b []byte
	i int
}

// ws skips white space and returns the index of the next byte.
func (p *fastParser) ws() int {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return p.i
		}
	}
	return p.i
}

// next skips white space and reports whether the next byte is c,
// consuming it if it is.
func (p *fastParser) next(c byte) bool {
	if p.ws() < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// object reads an object, calling member with each member's name after
// its colon; member reads the value.
func (p *fastParser) object(member func(name []byte) bool) bool {
	if !p.next('{') {
		return false
	}
	if p.next('}') {
		return true
	}
	for {
		name, ok := p.str()
		if !ok || !p.next(':') || !member(name) {
			return false
		}
		if p.next('}') {
			return true
		}
		if !p.next(',') {
			return false
		}
	}
}

// array reads an array, calling elem for each element.
func (p *fastParser) array(elem func() bool) bool {
	if !p.next('[') {
		return false
	}
	if p.next(']') {
		return true
	}
	for {
		if !elem() {
			return false
		}
		if p.next(']') {
			return true
		}
		if !p.next(',') {
			return false
		}
	}
}

// str reads a string of printable ASCII without escapes and returns its
// bytes.
func (p *fastParser) str() ([]byte, bool) {
	if !p.next('"') {
		return nil, false
	}
	start := p.i
	for ; p.i < len(p.b); p.i++ {
		switch c := p.b[p.i]; {
		case c == '"':
			p.i++
			return p.b[start : p.i-1], true
		case c < 0x20 || c >= 0x7f || c == '\\':
			return nil, false
		}
	}
	return nil, false
}

// int reads an integer of at most 18 digits: no fraction, no exponent.
func (p *fastParser) int() (int64, bool) {
	p.ws()
	neg := p.i < len(p.b) && p.b[p.i] == '-'
	if neg {
		p.i++
	}
	start := p.i
	var n int64
	for ; p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9'; p.i++ {
		n = n*10 + int64(p.b[p.i]-'0')
	}
	digits := p.i - start
	if digits == 0 || digits > 18 || (digits > 1 && p.b[start] == '0') {
		return 0, false
	}
	if p.i < len(p.b) && (p.b[p.i] == '.' || p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		return 0, false
	}
	if neg {
		n = -n
	}
	return n, true
}

// descriptor reads a descriptor into d, reusing its entries.
func (p *fastParser) descriptor(d *checkDescriptor) bool {
	es, cs := d.Entries[:0], d.Costs[:0]
	*d = checkDescriptor{}
	var seen [3]bool
	return p.object(func(name []byte) bool {
		switch string(name) {
		case "entries":
			ok := p.array(func() bool {
				es = append(es, entry{})
				return p.entry(&es[len(es)-1])
			})
			d.Entries = es
			return once(&seen[0]) && ok
		case "cost":
			n, ok := p.int()
			d.Cost = &n
			return once(&seen[1]) && ok
		case "costs":
			var ok bool
			d.Costs, ok = p.costs(cs)
			return once(&seen[2]) && ok
		}
		return false
	})
}

// costs reads a costs object of 1 to rules.MaxCostUnits units, each
// named once, into cs, reusing its elements: a unit named as the element
// it replaces keeps that element's string, so that a caller that sends
// the same units each time allocates nothing for them. More units are left
// to the general path, which explains the error.
func (p *fastParser) costs(cs costList) (costList, bool) {
	cs = cs[:0]
	ok := p.object(func(name []byte) bool {
		if len(cs) == rules.MaxCostUnits {
			return false
		}
		for _, c := range cs {
			if c.Unit == string(name) {
				return false
			}
		}
		n, ok := p.int()
		if i := len(cs); i < cap(cs) && cs[:i+1][i].Unit == string(name) {
			cs = append(cs, service.UnitCost{Unit: cs[:i+1][i].Unit, Cost: n}) // the string kept
		} else {
			cs = append(cs, service.UnitCost{Unit: string(name), Cost: n})
		}
		return ok
	})
	return cs, ok && len(cs) > 0
}

// entry reads an entry into e.
func (p *fastParser) entry(e *entry) bool {
	var seen [2]bool
	return p.object(func(name []byte) bool {
		var s []byte
		var ok bool
		switch string(name) {
		case "key":
			s, ok = p.str()
			e.Key = string(s)
			return once(&seen[0]) && ok
		case "value":
			s, ok = p.str()
			e.Value = string(s)
			return once(&seen[1]) && ok
		}
		return false
	})
}
