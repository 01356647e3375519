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

// TestMuteRepliesLetsRequestsThrough: after MuteReplies the server still receives what an open
// connection sends, but the client hears nothing back; a new connection passes both ways.
func TestMuteRepliesLetsRequestsThrough(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	received := make(chan byte, 16)
	go func() { // echoes every byte, and reports it
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				b := make([]byte, 1)
				for {
					if _, err := c.Read(b); err != nil {
						return
					}
					received <- b[0]
					if _, err := c.Write(b); err != nil {
						return
					}
				}
			}()
		}
	}()
	p, err := Start(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	b := make([]byte, 1)
	if _, err := c.Write([]byte("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, b); err != nil || b[0] != 'a' || <-received != 'a' {
		t.Fatalf("before muting: echoed %q, %v", b, err)
	}
	if n := p.MuteReplies(); n != 1 {
		t.Fatalf("muted %d connections, want 1", n)
	}
	if _, err := c.Write([]byte("b")); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-received:
		if got != 'b' {
			t.Fatalf("the server received %q, want b", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the server did not receive what a muted connection sent")
	}
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := c.Read(b); n != 0 || err == nil {
		t.Fatalf("a muted connection heard %q back (err %v), want nothing", b[:n], err)
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c2.Close() }()
	if _, err := c2.Write([]byte("c")); err != nil {
		t.Fatal(err)
	}
	_ = c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c2, b); err != nil || b[0] != 'c' {
		t.Fatalf("a new connection: echoed %q, %v; want c", b, err)
	}
}
