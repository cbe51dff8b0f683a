// Package headers converts record headers between the API's messages
// (catenapb.RecordHeader) and the log's (partlog.Header), for ingestion
// and replicas alike.
package headers

import (
	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// ToLog is a record's headers as the log stores them (nil for none).
func ToLog(hs []*catenapb.RecordHeader) []partlog.Header {
	if len(hs) == 0 {
		return nil
	}
	out := make([]partlog.Header, len(hs))
	for i, h := range hs {
		out[i] = partlog.Header{Key: []byte(h.GetKey()), Value: h.GetValue()}
	}
	return out
}

// ToWire is a stored record's headers as the API carries them (nil for
// none).
func ToWire(hs []partlog.Header) []*catenapb.RecordHeader {
	if len(hs) == 0 {
		return nil
	}
	out := make([]*catenapb.RecordHeader, len(hs))
	for i, h := range hs {
		out[i] = &catenapb.RecordHeader{Key: string(h.Key), Value: h.Value}
	}
	return out
}
