package devcluster

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Limits on the streams dev hosts, validated at start-up.
const (
	// maxStreams bounds --stream: every stream's partitions live in the
	// same few local processes.
	maxStreams = 32
	// maxPartitions bounds each stream's partitions.
	maxPartitions = 1024
	// minSegmentBytes and maxSegmentBytes are the replica's bounds on a
	// stream's segment size (replica/server: validateConfig).
	minSegmentBytes = 1 << 20
	maxSegmentBytes = 1 << 30
	// maxStreamNameLen and streamNameRE are the replica's rule for stream
	// names (replica/server: nameRE, maxNameLen, checked by Configure), so
	// that dev refuses a name at start-up rather than failing to create
	// the stream; TestStreamNamesAgreeWithTheReplica keeps them in step.
	maxStreamNameLen = 63
)

var streamNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// StreamSpec is one stream dev creates and is the chain master of.
type StreamSpec struct {
	Name string
	// Partitions of the stream; 0 takes Spec.Partitions.
	Partitions int
}

// ParseStreams parses --stream values, each NAME or NAME:PARTITIONS (a
// value holding commas has been split by the flag already). Names and
// counts are checked by Spec.Validate.
func ParseStreams(values []string) ([]StreamSpec, error) {
	out := make([]StreamSpec, 0, len(values))
	for _, v := range values {
		name, count, found := strings.Cut(strings.TrimSpace(v), ":")
		s := StreamSpec{Name: name}
		if found {
			n, err := strconv.Atoi(count)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("--stream %q: partitions %q must be a whole number of at least 1 (NAME or NAME:PARTITIONS)", v, count)
			}
			s.Partitions = n
		}
		out = append(out, s)
	}
	return out, nil
}

// validateStreamName applies the replica's rule for stream names.
func validateStreamName(name string) error {
	if !streamNameRE.MatchString(name) || len(name) > maxStreamNameLen {
		return fmt.Errorf("stream name %q must be 1-%d lowercase letters, digits or '-', starting and ending with a letter or digit", name, maxStreamNameLen)
	}
	return nil
}

// validateStreams checks the stream list: at least one, valid and distinct
// names, partition counts in range.
func validateStreams(streams []StreamSpec) error {
	if len(streams) == 0 {
		return errors.New("--stream: at least one stream is required")
	}
	if len(streams) > maxStreams {
		return fmt.Errorf("--stream: %d streams, at most %d", len(streams), maxStreams)
	}
	seen := map[string]bool{}
	for _, s := range streams {
		if err := validateStreamName(s.Name); err != nil {
			return fmt.Errorf("--stream: %w", err)
		}
		if seen[s.Name] {
			return fmt.Errorf("--stream %q is given twice", s.Name)
		}
		seen[s.Name] = true
		if s.Partitions < 0 || s.Partitions > maxPartitions {
			return fmt.Errorf("--stream %s:%d: partitions must be between 1 and %d", s.Name, s.Partitions, maxPartitions)
		}
	}
	return nil
}

// resolveStreams fills in the default partition count.
func resolveStreams(streams []StreamSpec, partitions int) []StreamSpec {
	out := make([]StreamSpec, len(streams))
	for i, s := range streams {
		if s.Partitions == 0 {
			s.Partitions = partitions
		}
		out[i] = s
	}
	return out
}

func streamNames(streams []StreamSpec) []string {
	out := make([]string, len(streams))
	for i, s := range streams {
		out[i] = s.Name
	}
	return out
}
