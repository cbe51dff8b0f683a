// Package producestream is Ingest.ProduceStream as both of its ends see
// it: a producer's produce requests on one gRPC stream, each answered on
// it when it completes and matched to its attempt by call_id, with what a
// unary Produce would return as its status carried in the answer. Ingestion
// and test servers serve it with Serve; the client reads answers with
// Result.
//
// Why a stream: a unary call sets up an HTTP/2 stream per request (headers
// and a timeout out, headers and trailers back, a handler goroutine on the
// server). Between two processes on the test VM a 1 KiB unary round trip
// took 149-156 µs and the same message on an open stream 79-105 µs
// (docs/benchmarks.md), for every produce request a producer sends.
package producestream

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// MaxInFlight bounds the requests read from one stream and not yet
// answered. Past it the server reads no more, and gRPC's flow control
// pushes back on the producer. A producer keeps far fewer in flight
// (client.ProducerOptions.MaxInFlight, default 6).
const MaxInFlight = 64

// errorDomain names Catena in ErrorInfo details, as the replicas' do.
const errorDomain = "streams.catena.io"

// Serve serves one ProduceStream: each request is handed to produce on a
// goroutine of its own, exactly as a unary call would be (so ingestion
// orders a producer's requests by their numbers, as it does for unary
// calls that overtake one another), under a deadline of its timeout_ms, and
// its result is sent back as Answer gives it. It returns when the
// producer closes its side and every request is answered, or with the
// error that ended the stream (the connection, a refusal of the caller).
//
// Once draining is closed (the server is stopping), Serve takes no more
// requests, answers the ones it took and ends the stream with UNAVAILABLE,
// at once if none is in flight: the producer sends what it has not been
// answered again on a new stream, to a node that is not stopping, and an
// idle producer's stream does not hold the server's graceful stop to its
// grace period. A nil draining never closes.
func Serve(stream catenapb.Ingest_ProduceStreamServer, produce func(context.Context, *catenapb.ProduceRequest) (*catenapb.ProduceResponse, error), draining <-chan struct{}) error {
	ctx := stream.Context()
	var (
		wg     sync.WaitGroup // requests taken and not yet answered
		sendMu sync.Mutex
		// mu orders taking a request (wg.Add) before the drain's wg.Wait:
		// the reader takes one only while draining is open, under mu, and
		// the drain passes through mu before it waits.
		mu sync.Mutex
	)
	slots := make(chan struct{}, MaxInFlight)
	// Requests are read on a goroutine of their own, so that a drain need
	// not wait for the next one to arrive; it only ever adds to wg before
	// the drain, and starts nothing after.
	received := make(chan error, 1)
	go func() {
		for {
			req, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				received <- nil
				return
			}
			if err != nil {
				received <- err
				return
			}
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				received <- status.FromContextError(ctx.Err()).Err()
				return
			}
			mu.Lock()
			if isClosed(draining) {
				// Not taken: a request read after the drain began (even
				// before Serve's own goroutine has seen it), or one read
				// before it that waited for a slot. The producer sends
				// what is not answered again, on a new stream.
				mu.Unlock()
				return
			}
			wg.Add(1)
			mu.Unlock()
			rctx, cancel := ctx, context.CancelFunc(func() {})
			if ms := req.GetTimeoutMs(); ms > 0 {
				rctx, cancel = context.WithTimeout(ctx, time.Duration(ms)*time.Millisecond)
			}
			go func() {
				defer wg.Done()
				resp, err := produce(rctx, req)
				cancel()
				sendMu.Lock()
				// A failed send means the stream is gone: Recv says so too.
				_ = stream.Send(Answer(req.GetCallId(), resp, err))
				sendMu.Unlock()
				<-slots
			}()
		}
	}()
	select {
	case err := <-received:
		wg.Wait()
		return err
	case <-draining:
		mu.Lock() // a request being taken now is in wg once this returns
		mu.Unlock()
		wg.Wait()
		return status.Error(codes.Unavailable, "catena: this ingestion node is shutting down; send the request again on a new stream")
	}
}

// isClosed says whether ch is closed; a nil ch never is.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Answer is the stream's answer to the attempt callID: resp, or err as the
// answer's error fields.
func Answer(callID uint64, resp *catenapb.ProduceResponse, err error) *catenapb.ProduceResponse {
	if err != nil {
		st := status.Convert(err)
		ans := &catenapb.ProduceResponse{CallId: callID, ErrorCode: int32(st.Code()), ErrorMessage: st.Message()}
		if st.Code() == codes.OK {
			ans.ErrorCode = int32(codes.Unknown)
		}
		for _, d := range st.Details() {
			if info, ok := d.(*errdetails.ErrorInfo); ok {
				ans.ErrorReason = info.GetReason()
			}
		}
		return ans
	}
	if resp == nil {
		resp = &catenapb.ProduceResponse{}
	}
	resp.CallId = callID
	return resp
}

// Result undoes Answer: the response, or the status error it carries.
func Result(ans *catenapb.ProduceResponse) (*catenapb.ProduceResponse, error) {
	if ans.GetErrorCode() == 0 {
		return ans, nil
	}
	st := status.New(codes.Code(ans.GetErrorCode()), ans.GetErrorMessage())
	if r := ans.GetErrorReason(); r != "" {
		if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: r, Domain: errorDomain}); err == nil {
			st = d
		}
	}
	return nil, st.Err()
}
