package api

import (
	"encoding/base64"
	"sort"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Every List is paged (AIP-158), so that no answer nears gRPC's message
// limit however much the registry holds: by items, and by bytes (a page
// ends early rather than pass MaxPageBytes; it always holds one item).
const (
	DefaultPageSize = 500
	MaxPageSize     = 5000
	// MaxPageBytes is half of gRPC's default 4 MiB receive limit.
	MaxPageBytes = 2 << 20
)

// pageRequest is what every List request carries.
type pageRequest interface {
	GetPageSize() int32
	GetPageToken() string
}

// page is the page of items (in key order) that req asks for, each
// turned into its message by to, and the token of the next one ("" on the
// last). A token is the last key of its page, so a page continues after
// it whatever changed in between.
func page[T any, P proto.Message](items []T, key func(T) string, to func(T) P, req pageRequest) ([]P, string, error) {
	size := int(req.GetPageSize())
	switch {
	case size < 0:
		return nil, "", status.Error(codes.InvalidArgument, "page_size: must not be negative")
	case size == 0:
		size = DefaultPageSize
	}
	size = min(size, MaxPageSize)
	start := 0
	if tok := req.GetPageToken(); tok != "" {
		last, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil || len(last) == 0 {
			return nil, "", status.Error(codes.InvalidArgument, "page_token: not a token this server gave; pass next_page_token as it came")
		}
		start = sort.Search(len(items), func(i int) bool { return key(items[i]) > string(last) })
	}
	end := min(len(items), start+size)
	out := make([]P, 0, end-start)
	bytes := 0
	for i := start; i < end; i++ {
		p := to(items[i])
		// An item's bytes in the response: itself, its tag and length.
		n := proto.Size(p) + 8
		if len(out) > 0 && bytes+n > MaxPageBytes {
			end = i
			break
		}
		out, bytes = append(out, p), bytes+n
	}
	next := ""
	if end < len(items) {
		next = base64.RawURLEncoding.EncodeToString([]byte(key(items[end-1])))
	}
	return out, next, nil
}
