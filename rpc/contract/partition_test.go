package contract

import (
	"fmt"
	"hash/fnv"
	"testing"
)

// Producers and ingestion route with PartitionFor; it must stay FNV-1a
// modulo the count, which every stored key's partition was chosen by.
func TestPartitionForIsFNV1aModuloTheCount(t *testing.T) {
	for _, n := range []uint32{1, 2, 4, 7, 256, 1000} {
		for i := range 2000 {
			key := []byte(fmt.Sprintf("key-%d", i))
			h := fnv.New32a()
			h.Write(key)
			if got, want := PartitionFor(key, n), h.Sum32()%n; got != want {
				t.Fatalf("PartitionFor(%q, %d) = %d, want %d", key, n, got, want)
			}
		}
	}
	if got := PartitionFor(nil, 3); got != 2166136261%3 {
		t.Fatalf("empty key: %d", got)
	}
}
