package registry

import (
	"fmt"
	"strings"
)

// Selector is a Kubernetes equality-based label selector: requirements
// "k=v", "k==v", "k!=v", "k" (exists) and "!k" (absent), all of which must hold.
type Selector []requirement

type requirement struct {
	key, value string
	op         string // "=", "!=", "exists", "!exists"
}

// ParseSelector parses "app=web,tier!=cache". The empty string selects everything.
func ParseSelector(s string) (Selector, error) {
	var sel Selector
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		var r requirement
		switch {
		case part == "":
			continue
		case strings.Contains(part, "!="):
			k, v, _ := strings.Cut(part, "!=")
			r = requirement{key: strings.TrimSpace(k), value: strings.TrimSpace(v), op: "!="}
		case strings.Contains(part, "="):
			k, v, _ := strings.Cut(part, "=")
			r = requirement{key: strings.TrimSpace(k), value: strings.TrimSpace(strings.TrimPrefix(v, "=")), op: "="}
		case strings.HasPrefix(part, "!"):
			r = requirement{key: strings.TrimSpace(part[1:]), op: "!exists"}
		default:
			r = requirement{key: part, op: "exists"}
		}
		if r.key == "" || strings.ContainsAny(r.key+r.value, " =!") {
			return nil, fmt.Errorf("bad label selector requirement %q", part)
		}
		sel = append(sel, r)
	}
	return sel, nil
}

// Matches reports whether labels satisfy every requirement.
func (s Selector) Matches(labels map[string]string) bool {
	for _, r := range s {
		v, ok := labels[r.key]
		switch r.op {
		case "=":
			if !ok || v != r.value {
				return false
			}
		case "!=":
			if ok && v == r.value {
				return false
			}
		case "exists":
			if !ok {
				return false
			}
		case "!exists":
			if ok {
				return false
			}
		}
	}
	return true
}
