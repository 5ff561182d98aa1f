package rules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Parse parses one rule file: filename is used in errors and in
// Spec.Source, data is its content. It returns every error it finds,
// joined; each is an *Error naming the file, the line and the key.
func Parse(filename string, data []byte) (*Domain, error) {
	p := &parser{file: filename}
	if len(data) > MaxFileBytes {
		p.add(1, "", fmt.Errorf("file is larger than %d bytes (MaxFileBytes)", MaxFileBytes))
		return nil, p.err()
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.add(1, "", errors.New("empty file: want a mapping with domain and descriptors"))
		} else {
			p.yamlError(err)
		}
		return nil, p.err()
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		p.add(extra.Line, "", errors.New("more than one YAML document; put each domain in its own file"))
	} else if !errors.Is(err, io.EOF) {
		p.yamlError(err)
	}
	if len(p.errs) > 0 {
		return nil, p.err()
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	root = resolve(root)
	var (
		f  fileConfig
		ps problems
	)
	ps.add(nil, root, "", f.UnmarshalYAML(root))
	for _, pr := range ps {
		p.add(pr.line, pr.key, pr.err)
	}
	// Build even after errors, to report duplicates too; build skips the
	// checks that partial input would make wrong.
	d := p.build(f.Domain, f.Descriptors, len(p.errs) == 0)
	if domain := f.given.get("domain"); domain != nil {
		d.line = domain.key.Line
	}
	if len(p.errs) > 0 {
		return nil, p.err()
	}
	return d, nil
}

// A parser collects the errors of one file.
type parser struct {
	file      string
	errs      []error
	truncated bool
}

// add records an error at line (1 at least) and key, up to
// maxErrorsPerFile of them.
func (p *parser) add(line int, key string, err error) {
	if len(p.errs) >= maxErrorsPerFile {
		p.truncated = true
		return
	}
	if line < 1 {
		line = 1
	}
	p.errs = append(p.errs, &Error{File: p.file, Line: line, Key: key, Err: err})
}

// err returns the errors recorded, joined, and says when some were left
// out.
func (p *parser) err() error {
	if len(p.errs) == 0 {
		return nil
	}
	errs := p.errs
	if p.truncated {
		last := errs[len(errs)-1].(*Error)
		errs = append(errs, &Error{File: p.file, Line: last.Line,
			Err: fmt.Errorf("too many errors; only the first %d are shown", maxErrorsPerFile)})
	}
	return errors.Join(errs...)
}

// yamlError turns an error of the YAML decoder into an *Error, taking the
// line from its "yaml: line N: " prefix when there is one.
func (p *parser) yamlError(err error) {
	msg := err.Error()
	var te *yaml.TypeError
	if errors.As(err, &te) && len(te.Errors) > 0 {
		msg = te.Errors[0]
	}
	msg = strings.TrimPrefix(msg, "yaml: ")
	line := 1
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if i := strings.IndexByte(rest, ':'); i > 0 {
			if n, err := strconv.Atoi(rest[:i]); err == nil {
				line = n
				msg = strings.TrimSpace(rest[i+1:])
			}
		}
	}
	p.add(line, "", fmt.Errorf("invalid YAML: %s", msg))
}
