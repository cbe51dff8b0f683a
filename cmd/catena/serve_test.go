package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"

	"github.com/catena-streams/catena/replica/server"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func status(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return resp.StatusCode
}

// Profiles are never on the metrics address: only on --pprof-listen.
func TestProfilesAreApartFromMetrics(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	metrics, profiles := freeAddr(t), freeAddr(t)
	if err := serveMetrics(ctx, metrics, newRegistry(), nil, logr.Discard()); err != nil {
		t.Fatal(err)
	}
	if err := servePprof(ctx, profiles, logr.Discard()); err != nil {
		t.Fatal(err)
	}
	for url, want := range map[string]int{
		"http://" + metrics + "/metrics":       http.StatusOK,
		"http://" + metrics + "/debug/pprof/":  http.StatusNotFound,
		"http://" + profiles + "/debug/pprof/": http.StatusOK,
		"http://" + profiles + "/metrics":      http.StatusNotFound,
	} {
		if got := status(t, url); got != want {
			t.Errorf("GET %s: %d, want %d", url, got, want)
		}
	}
	if err := servePprof(ctx, "", logr.Discard()); err != nil {
		t.Errorf("profiles off: %v", err)
	}
}

func TestAllowFlagsNeedTLS(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		tls  bool
		want string // error substring; empty: accepted
		opts int    // server options returned
	}{
		{"defaults, plaintext", nil, false, "", 0},
		{"defaults, TLS", nil, true, "", 2},
		{"a list without TLS", []string{"--allow-admin", "spiffe://catena/ns/x/operator"}, false, "--allow-admin needs TLS", 0},
		{"a list with TLS", []string{"--allow-admin", "spiffe://catena/ns/x/operator"}, true, "", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := &cobra.Command{}
			a := addAllowFlags(cmd, "replica", server.MethodClasses(), false)
			if err := cmd.ParseFlags(tc.args); err != nil {
				t.Fatal(err)
			}
			opts, err := a.serverOptions(tc.tls, server.MethodClasses(), nil)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
			if len(opts) != tc.opts {
				t.Errorf("%d server options, want %d", len(opts), tc.opts)
			}
		})
	}
}

func TestLogFormats(t *testing.T) {
	var text, js strings.Builder
	logr.FromSlogHandler(logHandler(&text, "text", 0)).Info("Replica serving", "addr", "127.0.0.1:7071")
	logr.FromSlogHandler(logHandler(&js, "json", 0)).Info("Replica serving", "addr", "127.0.0.1:7071")
	if !strings.Contains(text.String(), `msg="Replica serving" addr=127.0.0.1:7071`) {
		t.Errorf("text: %q", text.String())
	}
	var line map[string]any
	if err := json.Unmarshal([]byte(js.String()), &line); err != nil || line["msg"] != "Replica serving" || line["addr"] != "127.0.0.1:7071" {
		t.Errorf("json: %q (%v)", js.String(), err)
	}
	root := newRootCommand()
	root.SetArgs([]string{"--log-format", "yaml", "replica", "--id", "x", "--data-dir", t.TempDir()})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), `--log-format "yaml" must be text or json`) {
		t.Errorf("a bad --log-format: %v", err)
	}
}

func TestGroupPeersFlags(t *testing.T) {
	for _, tc := range []struct {
		name       string
		peers      []string
		advertise  string
		wantSelf   string
		wantErrSub string
	}{
		{"no peers: every group is this node's", nil, "", "", ""},
		{"an IP among the peers", []string{"orders-kafka.shop.svc"}, "10.244.1.5:9092", "10.244.1.5", ""},
		{"no advertised address", []string{"orders-kafka.shop.svc"}, "", "", "--peers needs --kafka-advertise"},
		{"an unspecified address", []string{"orders-kafka.shop.svc"}, "0.0.0.0:9092", "", "not an unspecified one"},
		// The operator passes [$(POD_IP)]:9092, for IPv4 and IPv6 pods.
		{"a bracketed IPv4 pod address", []string{"orders-kafka.shop.svc"}, "[10.244.1.5]:9092", "10.244.1.5", ""},
		{"a bracketed IPv6 pod address", []string{"orders-kafka.shop.svc"}, "[fd00:10:244::5]:9092", "fd00:10:244::5", ""},
		{"an IPv6 address without brackets", []string{"orders-kafka.shop.svc"}, "fd00:10:244::5:9092", "", "in brackets"},
		{"an IPv6 address not in its shortest form", []string{"orders-kafka.shop.svc"}, "[fd00:10:244:0:0:0:0:5]:9092", "fd00:10:244::5", ""},
		{"an unspecified IPv6 address", []string{"orders-kafka.shop.svc"}, "[::]:9092", "", "not an unspecified one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := groupPeers(tc.peers, tc.advertise)
			switch {
			case tc.wantErrSub != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErrSub) {
					t.Fatalf("err %v, want one saying %q", err, tc.wantErrSub)
				}
			case err != nil:
				t.Fatal(err)
			case tc.wantSelf == "" && m != nil:
				t.Fatalf("membership %v without peers", m)
			case tc.wantSelf != "" && (m == nil || m.Self().Host != tc.wantSelf):
				t.Fatalf("membership %v, want this node at %s", m, tc.wantSelf)
			}
		})
	}
	for ip, want := range map[string]string{"10.244.1.5": "10-244-1-5", "fd00::1": "fd00--1"} {
		if got := podDNSLabel(ip); got != want {
			t.Errorf("podDNSLabel(%s) = %s, want %s", ip, got, want)
		}
	}
}

// A replica refuses a scrub interval it would spend its disk on, or that
// is negative, before it opens anything.
func TestReplicaScrubIntervalFlag(t *testing.T) {
	for _, v := range []string{"5s", "-1h"} {
		dir := t.TempDir()
		root := newRootCommand()
		root.SetArgs([]string{"replica", "--id", "x", "--data-dir", dir, "--scrub-interval", v})
		if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "--scrub-interval must be 0 (no scrubs) or at least 1m") {
			t.Errorf("--scrub-interval %s: %v", v, err)
		}
		if names, _ := os.ReadDir(dir); len(names) != 0 {
			t.Errorf("--scrub-interval %s: the data directory holds %d entries, want none", v, len(names))
		}
	}
}
