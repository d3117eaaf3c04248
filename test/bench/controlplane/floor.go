package main

// The floor of a change's fan-out: the same bytes to the same number of
// agents over bare TCP sockets on loopback, one connection each, with no
// gRPC, HTTP/2 or hub: one write of a delta's size to every agent, each
// agent reading it and writing a small answer back, read by the sender.
// What the kernel and Go's poller alone cost, measured in the same run.

import (
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"time"
)

// measureFloor sends changes deltas of size bytes to n agents and prints
// the receipt latencies and this process's CPU per change (both sides).
func measureFloor(n, changes, size int) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	servers := make([]net.Conn, 0, n)
	accepted := make(chan error, 1)
	go func() {
		for range n {
			c, err := ln.Accept()
			if err != nil {
				accepted <- err
				return
			}
			servers = append(servers, c)
		}
		accepted <- nil
	}()
	clients := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range clients {
			c.Close()
		}
		for _, c := range servers {
			c.Close()
		}
	}()
	for range n {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return err
		}
		clients = append(clients, c)
	}
	if err := <-accepted; err != nil {
		return err
	}

	// Each agent: read a delta, note when, answer.
	received := make([][]time.Time, n)
	var agents sync.WaitGroup
	for i, c := range clients {
		agents.Add(1)
		go func() {
			defer agents.Done()
			buf := make([]byte, size)
			for range changes {
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
				received[i] = append(received[i], time.Now())
				if _, err := c.Write(buf[:15]); err != nil {
					return
				}
			}
		}()
	}
	// The sender reads every answer, as the server reads every
	// acknowledgement.
	answered := make(chan struct{}, n)
	for _, c := range servers {
		go func() {
			buf := make([]byte, 15)
			for range changes {
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
				answered <- struct{}{}
			}
		}()
	}

	delta := make([]byte, size)
	var lat []time.Duration
	cpuBefore := cpuTime(os.Getpid())
	for k := range changes {
		start := time.Now()
		for _, c := range servers {
			if _, err := c.Write(delta); err != nil {
				return err
			}
		}
		for range n {
			<-answered
		}
		for i := range received {
			lat = append(lat, received[i][k].Sub(start))
		}
	}
	cpu := (cpuTime(os.Getpid()) - cpuBefore) / time.Duration(changes)
	agents.Wait()
	slices.Sort(lat)
	q := func(p int) time.Duration { return lat[min(len(lat)-1, len(lat)*p/100)].Round(100 * time.Microsecond) }
	fmt.Printf("floor, the same fan-out over bare TCP sockets (%d bytes to each of %d agents, a 15-byte answer back, %d changes): p50 %v  p99 %v  max %v; CPU per change, both sides: %v\n",
		size, n, changes, q(50), q(99), lat[len(lat)-1].Round(100*time.Microsecond), cpu.Round(100*time.Microsecond))
	return nil
}
