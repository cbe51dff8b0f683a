package kafka

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/snappy"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
)

// Compression codecs of a record batch (the low three bits of its
// attributes).
const (
	codecNone   = 0
	codecGzip   = 1
	codecSnappy = 2
	codecLZ4    = 3
	codecZstd   = 4
)

// maxDecompressedBytes bounds what one record batch may decompress to: a
// small request must not inflate into gigabytes (a decompression bomb), so
// every codec stops there and reports errTooLarge. Kafka's own default
// limit for a batch (message.max.bytes) is 1 MiB.
const maxDecompressedBytes = 64 << 20

// errTooLarge: a batch decompresses to more than maxDecompressedBytes.
var errTooLarge = fmt.Errorf("a record batch decompresses to more than %d bytes", maxDecompressedBytes)

// zstdDecoder is shared: DecodeAll is safe for concurrent use, and refuses
// to decode more than maxDecompressedBytes.
var zstdDecoder, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(maxDecompressedBytes))

// decompress returns the records of a batch compressed with codec, at most
// max bytes of them.
func decompress(codec int, src []byte, max int) ([]byte, error) {
	switch codec {
	case codecNone:
		return src, nil
	case codecGzip:
		r, err := gzip.NewReader(bytes.NewReader(src))
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		return readAtMost(r, max, "gzip")
	case codecSnappy:
		return unsnappy(src, max)
	case codecLZ4:
		return readAtMost(lz4.NewReader(bytes.NewReader(src)), max, "lz4")
	case codecZstd:
		out, err := zstdDecoder.DecodeAll(src, nil)
		if errors.Is(err, zstd.ErrDecoderSizeExceeded) {
			return nil, errTooLarge
		}
		if err != nil {
			return nil, fmt.Errorf("zstd: %w", err)
		}
		if len(out) > max {
			return nil, errTooLarge
		}
		return out, nil
	default:
		return nil, fmt.Errorf("unknown compression codec %d", codec)
	}
}

func readAtMost(r io.Reader, max int, what string) ([]byte, error) {
	out, err := io.ReadAll(io.LimitReader(r, int64(max)+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if len(out) > max {
		return nil, errTooLarge
	}
	return out, nil
}

// xerialMagic starts the framing the Java client wraps snappy blocks in
// (snappy-java's SnappyOutputStream): magic, two version ints, then blocks
// of a big-endian length and a raw snappy block.
var xerialMagic = []byte{0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0}

// unsnappy decodes a raw snappy block or xerial-framed blocks.
func unsnappy(src []byte, max int) ([]byte, error) {
	if !bytes.HasPrefix(src, xerialMagic) {
		return unsnappyBlock(nil, src, max)
	}
	if len(src) < 16 {
		return nil, errors.New("snappy: xerial header is truncated")
	}
	var out []byte
	for rest := src[16:]; len(rest) > 0; {
		if len(rest) < 4 {
			return nil, errors.New("snappy: xerial block length is truncated")
		}
		n := binary.BigEndian.Uint32(rest)
		rest = rest[4:]
		if uint64(n) > uint64(len(rest)) {
			return nil, errors.New("snappy: xerial block is truncated")
		}
		var err error
		if out, err = unsnappyBlock(out, rest[:n], max-len(out)); err != nil {
			return nil, err
		}
		rest = rest[n:]
	}
	return out, nil
}

// unsnappyBlock appends one raw snappy block's content to dst.
func unsnappyBlock(dst, block []byte, max int) ([]byte, error) {
	n, err := snappy.DecodedLen(block)
	if err != nil {
		return nil, fmt.Errorf("snappy: %w", err)
	}
	if n > max {
		return nil, errTooLarge
	}
	out, err := snappy.Decode(make([]byte, n), block)
	if err != nil {
		return nil, fmt.Errorf("snappy: %w", err)
	}
	return append(dst, out...), nil
}
