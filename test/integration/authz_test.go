package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/producestream"
	"github.com/catena-streams/catena/rpc/transport"
	"github.com/catena-streams/catena/rpc/transport/transporttest"
)

// TestReplicaAdminNeedsTheOperatorsIdentity is issue 18's measurement turned
// into a test: a caller with no credential, or with a certificate of the
// cluster's CA that is not the operator's, could call Drop on a replica and
// erase every copy of a partition. With mutual TLS and --allow-admin, the
// replica refuses it before any handler runs (PermissionDenied naming the
// identity, counted in catena_rpc_refused_total), and the partition and its
// records are intact; the operator's identity is let through.
func TestReplicaAdminNeedsTheOperatorsIdentity(t *testing.T) {
	dir := t.TempDir()
	const (
		operator = "spiffe://catena/ns/authz/operator"
		pool     = "spiffe://catena/ns/authz/pool/secure"
		ingest   = "spiffe://catena/ns/authz/ingest/ledger"
	)
	_, files := testCA(t, dir)
	rf := files("replica", pool)
	addr, metricsAddr := freeAddr(t), freeAddr(t)
	logPath := filepath.Join(dir, "replica.log")
	p := startProc(t, "secure replica", logPath, "replica", "--id", "r0", "--listen", addr, "--data-dir", filepath.Join(dir, "data"),
		"--metrics-listen", metricsAddr,
		"--tls-cert", rf.CertFile, "--tls-key", rf.KeyFile, "--tls-ca", rf.ClientCAFile,
		"--allow-admin", operator, "--allow-replication", pool, "--allow-data", ingest+","+operator)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("---- replica log\n%s", tailFile(logPath, 3000))
		}
	})
	t.Cleanup(func() { p.stop(10 * time.Second) })

	client := func(f transport.TLSFiles) catenapb.ReplicaClient {
		cfg, err := f.Config()
		if err != nil {
			t.Fatal(err)
		}
		conn, err := transport.Dial(addr, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return catenapb.NewReplicaClient(conn)
	}
	op, producer, intruder := client(files("operator", operator)), client(files("ingest", ingest)), client(files("intruder", "spiffe://catena/ns/other/ingest/x"))

	eventually(t, 30*time.Second, func() error {
		if p.exited() {
			t.Fatalf("the replica exited: %v\n%s", p.err, tailFile(logPath, 3000))
		}
		_, err := op.Status(ctxT(t, time.Second), &catenapb.StatusRequest{})
		return err
	})
	cfg := &catenapb.StreamConfig{Partitions: 1}
	members := []*catenapb.Member{{Id: "r0", Addr: addr}}
	if _, err := op.Configure(ctxT(t, 10*time.Second), &catenapb.ConfigureRequest{Stream: "ledger", Epoch: 1, Members: members, Config: cfg}); err != nil {
		t.Fatalf("the operator's Configure: %v", err)
	}
	req := &catenapb.AppendRequest{Stream: "ledger", Epoch: 1}
	for i := range 25 {
		req.Records = append(req.Records, &catenapb.AppendRecord{Value: []byte(fmt.Sprint("record ", i))})
	}
	eventually(t, 20*time.Second, func() error {
		_, err := producer.Append(ctxT(t, 10*time.Second), req)
		return err
	})
	before, err := partStatus(ctxT(t, 5*time.Second), op, "ledger", 0)
	if err != nil {
		t.Fatal(err)
	}

	// Every admin call of a certificate the CA signed for someone else.
	st := wantCode(t, dropErr(intruder), codes.PermissionDenied, "the intruder's Drop")
	if !strings.Contains(st.Message(), `identity "spiffe://catena/ns/other/ingest/x" may not call /catena.v1.Replica/Drop`) {
		t.Errorf("the refusal does not say who and what: %q", st.Message())
	}
	_, err = intruder.Configure(ctxT(t, 5*time.Second), &catenapb.ConfigureRequest{Stream: "ledger", Epoch: 9, Members: members, Config: cfg})
	wantCode(t, err, codes.PermissionDenied, "the intruder's Configure")
	_, err = intruder.Truncate(ctxT(t, 5*time.Second), &catenapb.TruncateRequest{Stream: "ledger", To: 0})
	wantCode(t, err, codes.PermissionDenied, "the intruder's Truncate")
	_, err = intruder.Append(ctxT(t, 5*time.Second), req)
	wantCode(t, err, codes.PermissionDenied, "the intruder's Append")
	// Even the producer's ingestion identity may not administer.
	wantCode(t, dropErr(producer), codes.PermissionDenied, "ingestion's Drop")

	// No credential at all: no TLS session, no call.
	plain := replicaClient(t, addr)
	if _, err := plain.Drop(ctxT(t, 5*time.Second), &catenapb.DropRequest{Stream: "ledger", Epoch: 1}); err == nil {
		t.Fatal("a plaintext Drop was answered")
	}

	after, err := partStatus(ctxT(t, 5*time.Second), op, "ledger", 0)
	if err != nil {
		t.Fatalf("the partition after the refused calls: %v", err)
	}
	if after.GetEpoch() != before.GetEpoch() || after.GetLogEnd() != before.GetLogEnd() || after.GetLogEnd() != 25 || after.GetCommitted() != 25 {
		t.Errorf("refused calls changed the partition: before epoch %d end %d, after epoch %d end %d committed %d",
			before.GetEpoch(), before.GetLogEnd(), after.GetEpoch(), after.GetLogEnd(), after.GetCommitted())
	}

	expectMetrics(t, metricsAddr,
		`catena_rpc_refused_total{class="admin",code="PermissionDenied",method="/catena.v1.Replica/Drop"} 2`,
		`catena_rpc_refused_total{class="data",code="PermissionDenied",method="/catena.v1.Replica/Append"} 1`,
	)

	// The operator's own Drop goes through.
	if err := dropErr(op); err != nil {
		t.Fatalf("the operator's Drop: %v", err)
	}
	hosted, err := op.Status(ctxT(t, 5*time.Second), &catenapb.StatusRequest{Stream: "ledger"})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(hosted.GetPartitions()); n != 0 {
		t.Errorf("the operator's Drop left %d partitions of ledger", n)
	}
}

func dropErr(rc catenapb.ReplicaClient) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// stream_deleted: drop even a member's copy, the call that erased
	// every copy in the measurement.
	_, err := rc.Drop(ctx, &catenapb.DropRequest{Stream: "ledger", Epoch: 1, StreamDeleted: true})
	return err
}

// TestIngestionAuthorizesEachStreamsClients is the client side of issue 18:
// an ingestion node serving Stream payments, as the operator runs it from
// the Stream's spec.access, lets its writer produce and its reader consume,
// refuses the reader's produce (PermissionDenied naming the Stream) and a
// client without a certificate (Unauthenticated, over TLS), and lets only
// the aggregation workers reach another Stream of the pool through it.
// Nothing a refused call asked for is stored.
func TestIngestionAuthorizesEachStreamsClients(t *testing.T) {
	dir := t.TempDir()
	const (
		operator = "spiffe://catena/ns/authz/operator"
		pool     = "spiffe://catena/ns/authz/pool/secure"
		ingestID = "spiffe://catena/ns/authz/ingest/payments"
		writer   = "spiffe://catena/ns/authz/stream/payments/user/writer"
		reader   = "spiffe://catena/ns/authz/stream/payments/user/reader"
		workers  = "spiffe://catena/ns/authz/aggregation/*"
	)
	ca, files := testCA(t, dir)
	rf, inf := files("replica", pool), files("ingest", ingestID)
	raddr, iaddr, metricsAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	rlog, ilog := filepath.Join(dir, "replica.log"), filepath.Join(dir, "ingest.log")
	r := startProc(t, "secure replica", rlog, "replica", "--id", "r0", "--listen", raddr, "--data-dir", filepath.Join(dir, "data"),
		"--tls-cert", rf.CertFile, "--tls-key", rf.KeyFile, "--tls-ca", rf.ClientCAFile,
		"--allow-admin", operator, "--allow-replication", pool, "--allow-data", "spiffe://catena/ns/authz/ingest/*")
	t.Cleanup(func() { r.stop(10 * time.Second) })
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("---- replica log\n%s\n---- ingest log\n%s", tailFile(rlog, 3000), tailFile(ilog, 3000))
		}
	})
	opCfg, err := files("operator", operator).Config()
	if err != nil {
		t.Fatal(err)
	}
	opConn, err := transport.Dial(raddr, opCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = opConn.Close() })
	op := catenapb.NewReplicaClient(opConn)
	members := []*catenapb.Member{{Id: "r0", Addr: raddr}}
	for _, stream := range []string{"payments", "ledger"} {
		eventually(t, 30*time.Second, func() error {
			_, err := op.Configure(ctxT(t, 10*time.Second), &catenapb.ConfigureRequest{Stream: stream, Epoch: 1, Members: members, Config: &catenapb.StreamConfig{Partitions: 1}})
			return err
		})
	}
	in := startProc(t, "secure ingest", ilog, "ingest", "--listen", iaddr, "--replicas", raddr, "--metrics-listen", metricsAddr,
		"--tls-cert", inf.CertFile, "--tls-key", inf.KeyFile, "--tls-ca", inf.ClientCAFile,
		"--stream", "payments", "--allow-produce", writer, "--allow-consume", writer+","+reader, "--allow-metadata", writer+","+reader,
		"--allow-other-streams", workers+","+operator)
	t.Cleanup(func() { in.stop(10 * time.Second) })

	client := func(tlsCfg *tls.Config) catenapb.IngestClient {
		conn, err := transport.Dial(iaddr, tlsCfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return catenapb.NewIngestClient(conn)
	}
	certClient := func(name, identity string) catenapb.IngestClient {
		cfg, err := files(name, identity).Config()
		if err != nil {
			t.Fatal(err)
		}
		return client(cfg)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.PEM)
	w, rd, worker := certClient("writer", writer), certClient("reader", reader), certClient("worker", "spiffe://catena/ns/authz/aggregation/clicks")
	anon := client(&tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots})
	produce := func(c catenapb.IngestClient, stream, value string) error {
		_, err := c.Produce(ctxT(t, 10*time.Second), &catenapb.ProduceRequest{Stream: stream, Records: []*catenapb.ProduceRecord{{Value: []byte(value)}}})
		return err
	}

	eventually(t, 30*time.Second, func() error {
		if in.exited() {
			t.Fatalf("ingestion exited: %v\n%s", in.err, tailFile(ilog, 3000))
		}
		return produce(w, "payments", "first")
	})
	st := wantCode(t, produce(rd, "payments", "not allowed"), codes.PermissionDenied, "the reader's produce")
	for _, want := range []string{reader, "/catena.v1.Ingest/Produce on stream payments", writer} {
		if !strings.Contains(st.Message(), want) {
			t.Errorf("the refusal %q does not say %q", st.Message(), want)
		}
	}
	wantCode(t, produce(anon, "payments", "anonymous"), codes.Unauthenticated, "a produce without a certificate")
	wantCode(t, produce(w, "ledger", "elsewhere"), codes.PermissionDenied, "the writer's produce to another Stream")
	if err := produce(worker, "ledger", "checkpoint"); err != nil {
		t.Fatalf("an aggregation worker's produce to another Stream of the pool: %v", err)
	}

	// The reader consumes, by Fetch and by Subscribe (judged at its
	// request); a client without a certificate cannot.
	fetch := func(c catenapb.IngestClient, stream string) (*catenapb.FetchResponse, error) {
		return c.Fetch(ctxT(t, 10*time.Second), &catenapb.FetchRequest{Stream: stream, Partition: 0, Offset: 0})
	}
	got, err := fetch(rd, "payments")
	if err != nil {
		t.Fatalf("the reader's fetch: %v", err)
	}
	if n := len(got.GetRecords()); n != 1 || string(got.GetRecords()[0].GetValue()) != "first" {
		t.Errorf("payments holds %d records (%v), want only the writer's", n, got.GetRecords())
	}
	_, err = fetch(anon, "payments")
	wantCode(t, err, codes.Unauthenticated, "a fetch without a certificate")
	subscribe := func(c catenapb.IngestClient) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := c.Subscribe(ctx, &catenapb.SubscribeRequest{Stream: "payments", Partition: 0, Offset: 0})
		if err != nil {
			return err
		}
		_, err = s.Recv()
		return err
	}
	if err := subscribe(rd); err != nil {
		t.Fatalf("the reader's subscribe: %v", err)
	}
	wantCode(t, subscribe(anon), codes.Unauthenticated, "a subscribe without a certificate")
	got, err = fetch(worker, "ledger")
	if err != nil || len(got.GetRecords()) != 1 {
		t.Fatalf("ledger after the refused produce: %v, %d records, want the worker's one", err, len(got.GetRecords()))
	}

	// A producer's stream is judged by its requests, as Produce is. Two
	// in flight at once: each is answered on its own goroutine while the
	// next is received and judged.
	produceStream := func(c catenapb.IngestClient, stream, value string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := c.ProduceStream(ctx)
		if err != nil {
			return err
		}
		zero := uint32(0)
		for call := uint64(1); call <= 2; call++ {
			// The second names the first as its predecessor, as a
			// producer does: without it the two may reach the partition
			// in either order, and the log takes sequence 1 after 2 for
			// a retry.
			req := &catenapb.ProduceRequest{Stream: stream, CallId: call, ProducerId: 77, Request: call, PrevRequest: call - 1, Records: []*catenapb.ProduceRecord{{Value: []byte(value), Sequence: call, Partition: &zero}}}
			if err := s.Send(req); err != nil {
				return err
			}
		}
		for range 2 {
			ans, err := s.Recv()
			if err != nil {
				return err
			}
			resp, err := producestream.Result(ans)
			if err != nil {
				return err
			}
			for _, r := range resp.GetResults() {
				if r.GetErrorCode() != 0 {
					return fmt.Errorf("a record was refused: %s", r.GetErrorMessage())
				}
			}
		}
		return nil
	}
	if err := produceStream(w, "payments", "streamed"); err != nil {
		t.Fatalf("the writer's produce on a stream: %v", err)
	}
	st = wantCode(t, produceStream(rd, "payments", "not allowed"), codes.PermissionDenied, "the reader's produce on a stream")
	if !strings.Contains(st.Message(), "/catena.v1.Ingest/ProduceStream on stream payments") {
		t.Errorf("the refusal %q does not name the method and Stream", st.Message())
	}
	wantCode(t, produceStream(anon, "payments", "anonymous"), codes.Unauthenticated, "a produce on a stream without a certificate")
	got, err = fetch(rd, "payments")
	if err != nil || len(got.GetRecords()) != 3 || string(got.GetRecords()[2].GetValue()) != "streamed" {
		t.Fatalf("payments after the streamed produces: %v, %v; want the writer's three", err, got.GetRecords())
	}

	expectMetrics(t, metricsAddr,
		`catena_rpc_refused_total{class="produce",code="PermissionDenied",method="/catena.v1.Ingest/ProduceStream"} 1`,
		`catena_rpc_refused_total{class="produce",code="Unauthenticated",method="/catena.v1.Ingest/ProduceStream"} 1`,
		`catena_rpc_refused_total{class="produce",code="PermissionDenied",method="/catena.v1.Ingest/Produce"} 2`,
		`catena_rpc_refused_total{class="produce",code="Unauthenticated",method="/catena.v1.Ingest/Produce"} 1`,
		`catena_rpc_refused_total{class="consume",code="Unauthenticated",method="/catena.v1.Ingest/Subscribe"} 1`,
	)
}

// testCA makes a CA for one test, and a function that issues identity a
// certificate and writes it, its key and the CA under dir.
func testCA(t *testing.T, dir string) (*transporttest.CA, func(name, identity string) transport.TLSFiles) {
	t.Helper()
	ca, err := transporttest.NewCA("catena-test")
	if err != nil {
		t.Fatal(err)
	}
	return ca, func(name, identity string) transport.TLSFiles {
		t.Helper()
		f, err := ca.WriteFiles(dir, name, identity, ca.PEM)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
}

// TestMetricsOverTLS: with --metrics-tls a replica serves /metrics over
// HTTPS with its certificate, which a scraper verifies against the CA; the
// flag without a certificate is refused at start.
func TestMetricsOverTLS(t *testing.T) {
	dir := t.TempDir()
	ca, files := testCA(t, dir)
	rf := files("replica", "spiffe://catena/ns/authz/pool/secure")
	addr, metricsAddr := freeAddr(t), freeAddr(t)
	logPath := filepath.Join(dir, "replica.log")
	p := startProc(t, "replica", logPath, "replica", "--id", "r0", "--listen", addr, "--data-dir", filepath.Join(dir, "data"),
		"--metrics-listen", metricsAddr, "--metrics-tls",
		"--tls-cert", rf.CertFile, "--tls-key", rf.KeyFile, "--tls-ca", rf.ClientCAFile)
	t.Cleanup(func() { p.stop(10 * time.Second) })
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.PEM)
	scraper := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}
	eventually(t, 30*time.Second, func() error {
		if p.exited() {
			t.Fatalf("the replica exited: %v\n%s", p.err, tailFile(logPath, 3000))
		}
		resp, err := scraper.Get("https://" + metricsAddr + "/metrics")
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "go_goroutines") {
			return fmt.Errorf("status %d, %d bytes", resp.StatusCode, len(body))
		}
		return nil
	})
	if resp, err := http.Get("http://" + metricsAddr + "/metrics"); err == nil {
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("metrics served in plaintext too")
		}
	}

	bad := startProc(t, "replica without a certificate", filepath.Join(dir, "bad.log"), "replica", "--id", "r1", "--listen", freeAddr(t),
		"--data-dir", filepath.Join(dir, "bad"), "--metrics-listen", freeAddr(t), "--metrics-tls")
	eventually(t, 10*time.Second, func() error {
		if !bad.exited() {
			return errors.New("still running")
		}
		return nil
	})
	if out := tailFile(filepath.Join(dir, "bad.log"), 2000); !strings.Contains(out, "--metrics-tls needs --tls-cert") {
		t.Errorf("refused without saying why: %s", out)
	}
}

// expectMetrics fails t unless the metrics at addr hold every line of want.
func expectMetrics(t *testing.T, addr string, want ...string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	for _, w := range want {
		if !strings.Contains(string(body), w) {
			t.Errorf("metrics lack %s", w)
		}
	}
}
