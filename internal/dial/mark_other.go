//go:build !linux

package dial

import (
	"errors"
	"syscall"
)

func markControl(uint32) func(network, address string, c syscall.RawConn) error {
	return func(string, string, syscall.RawConn) error {
		return errors.New("socket marks are a Linux feature")
	}
}
