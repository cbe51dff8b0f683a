package kafka

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// op is what a failed call was doing, which picks among Kafka's codes for
// the same gRPC code.
type op int

const (
	opProduce op = iota
	opRead
	opAdmin
)

// kafkaError maps a Catena (gRPC status) error to the Kafka error code a
// client acts on: retriable where Catena's is (a chain being reconfigured,
// a member away), with the message kept for the versions that carry one.
func kafkaError(err error, o op) (*kerr.Error, string) {
	if err == nil {
		return nil, ""
	}
	st := status.Convert(err)
	return kafkaCode(st.Code(), o), st.Message()
}

func kafkaCode(c codes.Code, o op) *kerr.Error {
	switch c {
	case codes.OK:
		return nil
	case codes.NotFound:
		return kerr.UnknownTopicOrPartition
	case codes.InvalidArgument:
		switch o {
		case opProduce:
			return kerr.InvalidRecord
		case opAdmin:
			return kerr.InvalidRequest
		}
		return kerr.InvalidRequest
	case codes.OutOfRange:
		if o == opProduce {
			// The head refused a sequence that would break the
			// producer's order (or is older than its window).
			return kerr.OutOfOrderSequenceNumber
		}
		return kerr.OffsetOutOfRange
	case codes.FailedPrecondition:
		if o == opAdmin {
			return kerr.InvalidRequest
		}
		// A chain shorter than its minimum refuses writes until it
		// regrows.
		return kerr.NotEnoughReplicas
	case codes.AlreadyExists:
		return kerr.TopicAlreadyExists
	case codes.Unavailable, codes.Aborted:
		// The chain is being reconfigured or a member is away: refresh
		// metadata and retry.
		return kerr.NotLeaderForPartition
	case codes.DeadlineExceeded, codes.Canceled:
		return kerr.RequestTimedOut
	case codes.DataLoss:
		return kerr.KafkaStorageError
	case codes.PermissionDenied, codes.Unauthenticated:
		if o == opAdmin {
			return kerr.ClusterAuthorizationFailed
		}
		return kerr.TopicAuthorizationFailed
	case codes.ResourceExhausted:
		return kerr.PolicyViolation
	}
	return kerr.UnknownServerError
}

// errString is a nullable Kafka error message.
func errString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
