// Command catenactl produces to, consumes from, describes and benchmarks a
// Catena cluster through an ingestion endpoint.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/client"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run executes one command line and returns the process exit code.
// SIGINT/SIGTERM cancel the command's context (consume ends cleanly).
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := NewRootCommand(stdin, stdout, stderr)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	code := exitCode(err)
	fmt.Fprintf(stderr, "catenactl: %s\n", errorMessage(err))
	if code == exitUsage && cmd != nil {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	}
	return code
}

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // server or runtime error
	exitUsage   = 2 // bad command line or input
)

// exitError carries an exit code with its cause.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, args...)}
}

func usageError(err error) error { return &exitError{code: exitUsage, err: err} }

func failure(err error) error {
	if err == nil {
		return nil
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return err
	}
	return &exitError{code: exitFailure, err: err}
}

func failuref(format string, args ...any) error {
	return &exitError{code: exitFailure, err: fmt.Errorf(format, args...)}
}

// exitCode maps an error to the process exit code. Errors that did not
// come from a command body (cobra's own: unknown command or flag, bad
// argument count) are usage errors.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return exitUsage
}

// errorMessage renders err for humans: gRPC errors as their status message.
func errorMessage(err error) string {
	var ee *exitError
	if errors.As(err, &ee) {
		err = ee.err
	}
	return grpcMessage(err)
}

// grpcMessage renders the message of a (possibly wrapped) gRPC status
// error without the "rpc error: code = ..." decoration.
func grpcMessage(err error) string {
	if err == nil {
		return ""
	}
	var refused *client.TLSRefusedError
	if errors.As(err, &refused) {
		return fmt.Sprintf("TLS refused (check --tls-ca, --tls-cert and --tls-key): %v", refused.Handshake)
	}
	// Only unwrap bare status errors; wrapped ones carry their context
	// and are rendered by status.Convert as the full chain.
	if st, ok := status.FromError(err); ok {
		msg := st.Message()
		msg = strings.ReplaceAll(msg, "rpc error: code = "+st.Code().String()+" desc = ", "")
		switch {
		case st.Code() == codes.Unavailable:
			return "server unavailable: " + msg
		case st.Code() == codes.DeadlineExceeded:
			return "timed out: " + msg
		}
		return msg
	}
	return err.Error()
}
