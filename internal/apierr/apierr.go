// Package apierr is the errors the server and its clients agree on beyond
// a gRPC code: each carries a google.rpc.ErrorInfo whose reason a client
// tests, not the wording of its message. A leaf: the server, the agents,
// the speakers and lbctl import it.
package apierr

import (
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Domain is the ErrorInfo domain of Weir's reasons.
const Domain = "weir.weirlb.github.com"

// ReasonNotCurrent: the replica's state is not current (it lost its
// store, or fell behind it), so it refuses the call or ends the stream;
// the client should try another replica. Metadata "why" says why.
const ReasonNotCurrent = "REPLICA_NOT_CURRENT"

// NotCurrentMessage begins the message of a not-current refusal; servers
// before ErrorInfo said only that, and clients still recognise it.
const NotCurrentMessage = "replica not current"

// NotCurrent is a replica's refusal as not current, for why.
func NotCurrent(why string) error {
	st := status.New(codes.Unavailable, NotCurrentMessage+": "+why)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: ReasonNotCurrent, Domain: Domain, Metadata: map[string]string{"why": why}}); err == nil {
		st = d
	}
	return st.Err()
}

// IsNotCurrent reports whether err is a replica's refusal as not current:
// by its ErrorInfo, or by its message from a server before it.
func IsNotCurrent(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
			return info.GetReason() == ReasonNotCurrent
		}
	}
	return strings.HasPrefix(st.Message(), NotCurrentMessage)
}
