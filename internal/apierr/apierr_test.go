package apierr

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestNotCurrent(t *testing.T) {
	err := NotCurrent("lost the store")
	if !IsNotCurrent(err) || status.Code(err) != codes.Unavailable || status.Convert(err).Message() != "replica not current: lost the store" {
		t.Errorf("NotCurrent: %v, recognised %v", err, IsNotCurrent(err))
	}
	for _, other := range []error{
		status.Error(codes.Unavailable, "connection refused"),
		status.Error(codes.FailedPrecondition, "replica not current: a wrong code"),
		errors.New("replica not current: not a status"),
		nil,
	} {
		if IsNotCurrent(other) {
			t.Errorf("%v taken as not current", other)
		}
	}
	// A server before ErrorInfo said it only in words.
	if !IsNotCurrent(status.Error(codes.Unavailable, "replica not current: lost the store")) {
		t.Error("an older server's refusal not recognised")
	}
}
