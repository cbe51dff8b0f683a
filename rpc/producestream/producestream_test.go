package producestream_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/producestream"
)

func TestAnAnswerCarriesWhatProduceReturned(t *testing.T) {
	withReason, _ := status.New(codes.FailedPrecondition, "chain too short").WithDetails(&errdetails.ErrorInfo{Reason: "CHAIN_TOO_SHORT", Domain: "streams.catena.io"})
	tests := []struct {
		name       string
		resp       *catenapb.ProduceResponse
		err        error
		wantCode   codes.Code
		wantReason string
	}{
		{"results", &catenapb.ProduceResponse{Results: []*catenapb.ProduceResult{{Partition: 2, Offset: 7}}, Partitions: 4}, nil, codes.OK, ""},
		{"no results", nil, nil, codes.OK, ""},
		{"a status", nil, status.Error(codes.NotFound, `stream "x" not found`), codes.NotFound, ""},
		{"a status with a reason", nil, withReason.Err(), codes.FailedPrecondition, "CHAIN_TOO_SHORT"},
		{"not a status", nil, errors.New("plain"), codes.Unknown, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ans := producestream.Answer(42, proto.Clone(orEmpty(tc.resp)).(*catenapb.ProduceResponse), tc.err)
			if ans.GetCallId() != 42 {
				t.Fatalf("call id %d, want 42", ans.GetCallId())
			}
			// What the client gets after the wire.
			b, _ := proto.Marshal(ans)
			var got catenapb.ProduceResponse
			if err := proto.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			resp, err := producestream.Result(&got)
			st := status.Convert(err)
			if st.Code() != tc.wantCode {
				t.Fatalf("code %v (%v), want %v", st.Code(), err, tc.wantCode)
			}
			if tc.err != nil {
				if st.Message() != status.Convert(tc.err).Message() || resp != nil {
					t.Fatalf("message %q, response %v; want %q and none", st.Message(), resp, status.Convert(tc.err).Message())
				}
				var reason string
				for _, d := range st.Details() {
					if info, ok := d.(*errdetails.ErrorInfo); ok {
						reason = info.GetReason()
					}
				}
				if reason != tc.wantReason {
					t.Fatalf("reason %q, want %q", reason, tc.wantReason)
				}
				return
			}
			if len(resp.GetResults()) != len(tc.resp.GetResults()) || resp.GetPartitions() != tc.resp.GetPartitions() {
				t.Fatalf("response %v, want %v", resp, tc.resp)
			}
		})
	}
}

func orEmpty(r *catenapb.ProduceResponse) *catenapb.ProduceResponse {
	if r == nil {
		return &catenapb.ProduceResponse{}
	}
	return r
}

type server struct {
	catenapb.UnimplementedIngestServer
	produce  func(context.Context, *catenapb.ProduceRequest) (*catenapb.ProduceResponse, error)
	draining chan struct{}
}

func (s *server) ProduceStream(st catenapb.Ingest_ProduceStreamServer) error {
	return producestream.Serve(st, s.produce, s.draining)
}

func serve(t *testing.T, produce func(context.Context, *catenapb.ProduceRequest) (*catenapb.ProduceResponse, error)) catenapb.Ingest_ProduceStreamClient {
	t.Helper()
	return serveDraining(t, produce, nil)
}

func serveDraining(t *testing.T, produce func(context.Context, *catenapb.ProduceRequest) (*catenapb.ProduceResponse, error), draining chan struct{}) catenapb.Ingest_ProduceStreamClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	catenapb.RegisterIngestServer(g, &server{produce: produce, draining: draining})
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	st, err := catenapb.NewIngestClient(conn).ProduceStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestRequestsAreServedConcurrentlyUnderTheirOwnDeadlines(t *testing.T) {
	// The first request waits for its deadline; the second, sent after
	// it, is answered first. Neither ends the stream.
	st := serve(t, func(ctx context.Context, req *catenapb.ProduceRequest) (*catenapb.ProduceResponse, error) {
		if req.GetRequest() == 1 {
			<-ctx.Done()
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		if d, ok := ctx.Deadline(); ok && time.Until(d) < 5*time.Second {
			return nil, status.Error(codes.Internal, "a request without timeout_ms got a deadline of its own")
		}
		return &catenapb.ProduceResponse{Partitions: 1}, nil
	})
	if err := st.Send(&catenapb.ProduceRequest{Stream: "s", Request: 1, CallId: 10, TimeoutMs: 200}); err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&catenapb.ProduceRequest{Stream: "s", Request: 2, CallId: 11}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		call uint64
		code codes.Code
	}{{11, codes.OK}, {10, codes.DeadlineExceeded}} {
		ans, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		_, err = producestream.Result(ans)
		if ans.GetCallId() != want.call || status.Code(err) != want.code {
			t.Fatalf("answer to call %d: %v; want call %d with %v", ans.GetCallId(), err, want.call, want.code)
		}
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("the stream after the producer closed its side: %v, want its end", err)
	}
}

func TestADrainingServerAnswersWhatItTookAndEndsTheStream(t *testing.T) {
	draining := make(chan struct{})
	started, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	st := serveDraining(t, func(ctx context.Context, req *catenapb.ProduceRequest) (*catenapb.ProduceResponse, error) {
		if calls.Add(1) == 1 {
			close(started)
		}
		<-release
		return &catenapb.ProduceResponse{Partitions: 1}, nil
	}, draining)
	if err := st.Send(&catenapb.ProduceRequest{Stream: "s", Request: 1, CallId: 1}); err != nil {
		t.Fatal(err)
	}
	<-started
	close(draining)
	// Taken before the drain: answered. Sent after it: not served; the
	// stream ends once the first is answered.
	if err := st.Send(&catenapb.ProduceRequest{Stream: "s", Request: 2, CallId: 2}); err != nil {
		t.Fatal(err)
	}
	close(release)
	ans, err := st.Recv()
	if err != nil || ans.GetCallId() != 1 {
		t.Fatalf("first answer %v, %v; want call 1's", ans, err)
	}
	if _, err := st.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("after the drain: %v, want the stream ended UNAVAILABLE", err)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d requests served, want only the one taken before the drain", n)
	}
}

func TestADrainingServerEndsAnIdleStreamAtOnce(t *testing.T) {
	// A producer with nothing to send must not hold the server's
	// graceful stop until its grace period ends.
	draining := make(chan struct{})
	st := serveDraining(t, func(ctx context.Context, req *catenapb.ProduceRequest) (*catenapb.ProduceResponse, error) {
		return &catenapb.ProduceResponse{}, nil
	}, draining)
	if err := st.Send(&catenapb.ProduceRequest{Stream: "s", Request: 1, CallId: 1}); err != nil {
		t.Fatal(err)
	}
	if ans, err := st.Recv(); err != nil || ans.GetCallId() != 1 {
		t.Fatalf("answer %v, %v", ans, err)
	}
	close(draining)
	if _, err := st.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("an idle stream after the drain: %v, want it ended UNAVAILABLE", err)
	}
}
