package client

import (
	"fmt"
	"testing"
)

func TestRangeAssign(t *testing.T) {
	for _, tc := range []struct {
		name   string
		subs   map[string][]string
		counts map[string]int
		want   string
	}{
		{"even", map[string][]string{"a": {"s"}, "b": {"s"}}, map[string]int{"s": 4},
			"map[a:map[s:[0 1]] b:map[s:[2 3]]]"},
		{"the first members take the remainder", map[string][]string{"c": {"s"}, "a": {"s"}, "b": {"s"}}, map[string]int{"s": 7},
			"map[a:map[s:[0 1 2]] b:map[s:[3 4]] c:map[s:[5 6]]]"},
		{"more members than partitions", map[string][]string{"a": {"s"}, "b": {"s"}, "c": {"s"}}, map[string]int{"s": 2},
			"map[a:map[s:[0]] b:map[s:[1]]]"},
		{"each stream among its own subscribers", map[string][]string{"a": {"s", "t"}, "b": {"t"}}, map[string]int{"s": 2, "t": 2},
			"map[a:map[s:[0 1] t:[0]] b:map[t:[1]]]"},
		{"a stream that does not exist gets nothing", map[string][]string{"a": {"gone"}}, map[string]int{"gone": 0},
			"map[]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fmt.Sprint(rangeAssign(tc.subs, tc.counts)); got != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
		})
	}
}
