package kafka

import (
	"strings"
	"testing"
)

// TestAdvertisedAddressForms: --kafka-advertise takes host:port with a
// name, an IPv4 address or a bracketed IPv6 one; the operator passes
// [$(POD_IP)]:9092, brackets around an IPv4 address too. Bad ones are
// refused with the reason.
func TestAdvertisedAddressForms(t *testing.T) {
	for _, tc := range []struct {
		in         string
		host       string
		port       int32
		advertised string
		wantErrSub string
	}{
		{in: "10.244.1.5:9092", host: "10.244.1.5", port: 9092, advertised: "10.244.1.5:9092"},
		{in: "[10.244.1.5]:9092", host: "10.244.1.5", port: 9092, advertised: "10.244.1.5:9092"},
		{in: "broker-0.orders-kafka.shop.svc:9093", host: "broker-0.orders-kafka.shop.svc", port: 9093, advertised: "broker-0.orders-kafka.shop.svc:9093"},
		{in: "[fd00:10:244::5]:9092", host: "fd00:10:244::5", port: 9092, advertised: "[fd00:10:244::5]:9092"},
		{in: "fd00:10:244::5:9092", wantErrSub: "an IPv6 address in brackets"},
		{in: "10.244.1.5", wantErrSub: "missing port"},
		{in: "10.244.1.5:0", wantErrSub: "not a port number"},
		{in: "10.244.1.5:70000", wantErrSub: "not a port number"},
	} {
		s := &Server{}
		err := s.setAdvertised(tc.in)
		switch {
		case tc.wantErrSub != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErrSub) {
				t.Errorf("%q: err %v, want one saying %q", tc.in, err, tc.wantErrSub)
			}
		case err != nil:
			t.Errorf("%q: %v", tc.in, err)
		case s.host != tc.host || s.port != tc.port || s.Advertised() != tc.advertised:
			t.Errorf("%q: host %q port %d (%s), want %q %d (%s)", tc.in, s.host, s.port, s.Advertised(), tc.host, tc.port, tc.advertised)
		}
	}
}
