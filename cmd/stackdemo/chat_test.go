package main

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMain lets a test run this binary as stackdemo itself (a child
// process of the test, for the chat test).
func TestMain(m *testing.M) {
	if os.Getenv("STACKDEMO_AS_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// chatProc is a stackdemo chat child process and the lines it printed.
type chatProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	mu    sync.Mutex
	lines []string
	done  chan struct{}
}

func startChat(t *testing.T, name string, env []string) *chatProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "chat", "-name", name, "-cluster", "chat-test")
	cmd.Env = append(os.Environ(), append(env, "STACKDEMO_AS_MAIN=1")...)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	p := &chatProc{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = stdin.Close()
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
		}
		_ = cmd.Wait()
	})
	return p
}

// printed waits until the process printed a line for which ok holds.
func (p *chatProc) printed(t *testing.T, what string, ok func(string) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		p.mu.Lock()
		for _, l := range p.lines {
			if ok(l) {
				p.mu.Unlock()
				return
			}
		}
		p.mu.Unlock()
		select {
		case <-p.done:
			t.Fatalf("the chat process ended before it printed %s; it printed %q", what, p.lines)
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("no %s within 30s; printed %q", what, p.lines)
}

func freeUDPPort(t *testing.T) int {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// TestChatBetweenTwoProcesses: two stackdemo chat processes on the default
// stack (127.0.0.1, a multicast group of the test's own) see a view of
// both, and each prints the line the other typed.
func TestChatBetweenTwoProcesses(t *testing.T) {
	env := []string{
		"STRATA_BIND_PORT=" + strconv.Itoa(freeUDPPort(t)),
		fmt.Sprintf("STRATA_MCAST_ADDR=239.%d.%d.%d", 1+rand.IntN(250), rand.IntN(256), 1+rand.IntN(254)),
		"STRATA_MCAST_PORT=" + strconv.Itoa(freeUDPPort(t)),
	}
	a := startChat(t, "alice", env)
	b := startChat(t, "bob", env)
	both := func(l string) bool {
		return strings.HasPrefix(l, "** view") && strings.Contains(l, "(2)") && strings.Contains(l, "alice") && strings.Contains(l, "bob")
	}
	a.printed(t, "the 2-member view", both)
	b.printed(t, "the 2-member view", both)
	_, err := io.WriteString(a.stdin, "hello from alice\n")
	require.NoError(t, err)
	_, err = io.WriteString(b.stdin, "hi alice, bob here\n")
	require.NoError(t, err)
	b.printed(t, "alice's line", func(l string) bool { return l == "alice: hello from alice" })
	a.printed(t, "bob's line", func(l string) bool { return l == "bob: hi alice, bob here" })
	// End of input: both leave and exit 0.
	require.NoError(t, a.stdin.Close())
	require.NoError(t, b.stdin.Close())
	<-a.done
	<-b.done
	require.NoError(t, a.cmd.Wait())
	require.NoError(t, b.cmd.Wait())
}
