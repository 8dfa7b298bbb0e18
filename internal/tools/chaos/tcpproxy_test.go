package chaos

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTCPProxy(t *testing.T) {
	t.Parallel()

	// echoServer answers each line with its name and the line.
	echoServer := func(t *testing.T, name string) string {
		t.Helper()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { _ = ln.Close() })
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer conn.Close()
					r := bufio.NewReader(conn)
					for {
						line, err := r.ReadString('\n')
						if err != nil {
							return
						}
						if _, err := conn.Write([]byte(name + ":" + line)); err != nil {
							return
						}
					}
				}()
			}
		}()
		return ln.Addr().String()
	}

	type testBundle struct {
		proxy *tcpProxy
		a, b  string // two echo servers
	}
	setup := func(t *testing.T) *testBundle {
		t.Helper()
		a, b := echoServer(t, "a"), echoServer(t, "b")
		proxy, err := newTCPProxy("test", a)
		require.NoError(t, err)
		t.Cleanup(func() { _ = proxy.Close() })
		return &testBundle{proxy: proxy, a: a, b: b}
	}
	dial := func(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
		t.Helper()
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		return conn, bufio.NewReader(conn)
	}
	roundTrip := func(t *testing.T, conn net.Conn, r *bufio.Reader, line string, wait time.Duration) (string, error) {
		t.Helper()
		if _, err := conn.Write([]byte(line + "\n")); err != nil {
			return "", err // a closed connection may already refuse the write
		}
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(wait)))
		return r.ReadString('\n')
	}

	t.Run("Close", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		conn, r := dial(t, bundle.proxy.Addr())
		require.NoError(t, bundle.proxy.Close())
		_, err := roundTrip(t, conn, r, "x", 5*time.Second)
		require.Error(t, err)
		_, err = net.DialTimeout("tcp", bundle.proxy.Addr(), time.Second)
		require.Error(t, err)
		require.NoError(t, bundle.proxy.Close())
	})

	t.Run("Forwards", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		require.Contains(t, bundle.proxy.Addr(), "127.0.0.1:")
		conn, r := dial(t, bundle.proxy.Addr())
		got, err := roundTrip(t, conn, r, "hello", 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, "a:hello\n", got)
	})

	t.Run("PauseResume", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		conn, r := dial(t, bundle.proxy.Addr())
		_, err := roundTrip(t, conn, r, "warm", 5*time.Second)
		require.NoError(t, err)

		bundle.proxy.Pause()
		_, err = roundTrip(t, conn, r, "held", 300*time.Millisecond)
		var netErr net.Error
		require.ErrorAs(t, err, &netErr)
		require.True(t, netErr.Timeout(), "paused proxy forwarded: %v", err)

		bundle.proxy.Resume()
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
		got, err := r.ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "a:held\n", got) // kept open, nothing lost
	})

	t.Run("Switch", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		old, oldR := dial(t, bundle.proxy.Addr())
		_, err := roundTrip(t, old, oldR, "x", 5*time.Second)
		require.NoError(t, err)

		bundle.proxy.Switch(bundle.b)
		require.Equal(t, bundle.b, bundle.proxy.Target())
		_, err = roundTrip(t, old, oldR, "y", 5*time.Second)
		require.Error(t, err) // existing connections are closed

		conn, r := dial(t, bundle.proxy.Addr())
		got, err := roundTrip(t, conn, r, "z", 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, "b:z\n", got)
	})
}
