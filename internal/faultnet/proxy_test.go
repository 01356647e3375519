package faultnet

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// TestDelayedProxyHoldsBytesAndKeepsThem checks that a delayed proxy's round trip takes at least
// twice its one-way delay and that every byte arrives, in order.
func TestDelayedProxyHoldsBytesAndKeepsThem(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	go func() { // an echo server
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); _ = c.Close() }()
		}
	}()
	const oneWay = 20 * time.Millisecond
	p, err := StartDelayed("127.0.0.1:0", ln.Addr().String(), oneWay)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	want := bytes.Repeat([]byte("0123456789"), 100000) // 1 MB: many chunks
	start := time.Now()
	go func() { _, _ = c.Write(want) }()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if rt := time.Since(start); rt < 2*oneWay {
		t.Errorf("round trip %v, want at least %v", rt, 2*oneWay)
	}
	if !bytes.Equal(got, want) {
		t.Error("the bytes that came back differ from those sent")
	}
}
