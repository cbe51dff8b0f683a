package aggregator

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzScanObject holds the scanner to encoding/json: the same documents
// are JSON objects, and the same strings and numbers are found at the same
// paths (the last of repeated keys wins in both).
func FuzzScanObject(f *testing.F) {
	for _, s := range []string{
		`{}`, ` {"a": 1} `, `{"a": {"b": "x"}, "a": {"b": "y"}}`, `{"a": [1, {"b": 2}], "b": null}`,
		`{"a\u0062": "\ud83d\ude00", "b": "\ud800"}`, `{"a": 1e400, "b": -0.5E-3, "c": 01}`, `{"a": "\x01"}`,
		`{"a": tru}`, `{"a": 1,}`, `{"a" 1}`, `[1]`, `{"a": "\/\b\f\n\r\t\"\\"}`, "{\"a\": \"\xff\"}",
		`{"a": {"b": {"c": true}}}`, `{"b": 2, "a": {"b": 1}}`, `{"a":1}x`, `{"a": {"b": 1}, "a": 5}`, `{"a": {"b": 1}, "a": {"c": 2}}`,
	} {
		f.Add([]byte(s))
	}
	trie := &fieldTrie{}
	paths := [][]string{{"a"}, {"b"}, {"a", "b"}, {"ab"}}
	for i, p := range paths {
		trie.add(p, i)
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		found := make([]span, len(paths))
		ok := scanObject(doc, trie, found)
		var m map[string]any
		d := json.NewDecoder(bytes.NewReader(doc))
		d.UseNumber()
		err := d.Decode(&m)
		want := json.Valid(doc) && err == nil && m != nil
		if ok != want {
			t.Fatalf("scanObject(%q) = %v, encoding/json says %v (%v)", doc, ok, want, err)
		}
		if !ok {
			return
		}
		for i, p := range paths {
			v, has := lookupPath(m, p)
			got := found[i]
			switch x := v.(type) {
			case string:
				if got.kind != jsonString || got.text() != x {
					t.Fatalf("%q at %v: found %v %q, want string %q", doc, p, got.kind, got.text(), x)
				}
			case json.Number:
				if got.kind != jsonNumber || got.text() != x.String() {
					t.Fatalf("%q at %v: found %v %q, want number %s", doc, p, got.kind, got.text(), x)
				}
			case nil:
				if has && got.kind != jsonNull || !has && got.kind != jsonMissing {
					t.Fatalf("%q at %v: found %v, want null or missing (has %v)", doc, p, got.kind, has)
				}
			default:
				if got.kind != jsonOther {
					t.Fatalf("%q at %v: found %v, want another value", doc, p, got.kind)
				}
			}
		}
	})
}

func lookupPath(m map[string]any, path []string) (any, bool) {
	var cur any = m
	for _, p := range path {
		o, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = o[p]; !ok {
			return nil, false
		}
	}
	return cur, true
}
