package partlog

import (
	"fmt"

	"golang.org/x/sys/unix"
)

const (
	// preallocBytes is how far ahead of the log's end the active segment
	// is zero-filled.
	preallocBytes = 256 << 10
	// preallocMaxFrame: logs whose frames average more than this are not
	// zero-filled ahead.
	preallocMaxFrame = 16 << 10
)

var zeros = make([]byte, preallocBytes)

// Preallocate zero-fills the active segment ahead of its last frame and
// makes the zeros durable, when less than half of preallocBytes is left.
func (l *Log) Preallocate() error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	l.wmu.Lock()
	if err := l.usable(); err != nil {
		l.wmu.Unlock()
		return err
	}
	if l.journal != nil {
		// Its appends do not fsync the segment: no size change to spare.
		l.wmu.Unlock()
		return nil
	}
	s := l.active()
	from := max(s.zeroTo, s.size)
	limit := l.limits.Load().SegmentBytes
	to := min(s.size+preallocBytes, limit)
	if l.avgFrame > preallocMaxFrame || from-s.size >= preallocBytes/2 || to <= from {
		l.wmu.Unlock()
		return nil
	}
	if _, err := s.f.WriteAt(zeros[:to-from], from); err != nil {
		l.wmu.Unlock()
		return l.fail(ErrFailed, "zero-fill %s at byte %d: %w", s.path, from, err)
	}
	s.zeroTo = to
	l.wmu.Unlock()
	if err := datasync(s.f); err != nil {
		return l.fail(ErrFailed, "fsync %s after zero-filling: %w", s.path, err)
	}
	return nil
}

// cutZeros cuts the zeros written ahead of s's frames. Called with wmu held.
func (s *segment) cutZeros() error {
	if s.zeroTo <= s.size {
		return nil
	}
	if err := s.f.Truncate(s.size); err != nil {
		return fmt.Errorf("cut zero-filled tail of %s at byte %d: %w", s.path, s.size, err)
	}
	s.zeroTo = 0
	return nil
}

// datasync is fdatasync where the file has a descriptor, else Sync.
func datasync(f File) error {
	if fd, ok := fdOf(f); ok {
		for {
			err := unix.Fdatasync(fd)
			if err != unix.EINTR {
				return err
			}
		}
	}
	return f.Sync()
}
