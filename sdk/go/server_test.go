package qftrio

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The tests run against a real `qftrio serve --dev` on a fresh SQLite file
// and a free port, started once for the package (tests share it by using
// queues of their own). QFTRIO_BIN names the qftrio executable
// (tests/test_sdk_go.py sets it); without it, the repository's .venv's.

// token is a --dev server's credential: tenant default, and a worker.
const token = "dev"

// cap only turns a hang into a failure: every wait is bounded by the work.
const cap = 60 * time.Second

var serverURL string

func qftrioBin() string {
	if bin := os.Getenv("QFTRIO_BIN"); bin != "" {
		return bin
	}
	root, _ := filepath.Abs(filepath.Join("..", ".."))
	return filepath.Join(root, ".venv", "bin", "qftrio")
}

// freePort is a port nothing listens on (it was free a moment ago).
func freePort() (int, error) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer listener.Close()
	return listener.Addr().(*net.TCPAddr).Port, nil
}

// syncBuffer collects a process's output while it runs.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type server struct {
	URL string
	cmd *exec.Cmd
	dir string
	log *syncBuffer
	end chan error
}

// startServer starts a server and waits until it answers (bounded by its
// start-up, and by cap).
func startServer(extra ...string) (*server, error) {
	dir, err := os.MkdirTemp("", "qftrio-go-")
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	bind := fmt.Sprintf("127.0.0.1:%d", port)
	args := append([]string{"serve", "--dev", "--db", filepath.Join(dir, "qftrio.db"), "--bind", bind}, extra...)
	s := &server{URL: "http://" + bind, cmd: exec.Command(qftrioBin(), args...), dir: dir, log: &syncBuffer{}, end: make(chan error, 1)}
	s.cmd.Stderr = s.log
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", qftrioBin(), err)
	}
	go func() { s.end <- s.cmd.Wait() }()
	client, _ := NewClient(s.URL, token)
	client.Timeout = time.Second
	until := time.Now().Add(cap)
	for {
		if health, err := client.Health(context.Background()); err == nil && health.Status == "ok" {
			return s, nil
		}
		select {
		case err := <-s.end:
			s.end <- err
			return nil, fmt.Errorf("qftrio serve exited (%v) before it answered:\n%s", err, s.log.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(until) {
			s.stop()
			return nil, fmt.Errorf("qftrio serve did not answer within %s:\n%s", cap, s.log.String())
		}
	}
}

func (s *server) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	<-s.end
	os.RemoveAll(s.dir)
}

func TestMain(m *testing.M) {
	s, err := startServer()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	serverURL = s.URL
	code := m.Run()
	s.stop()
	os.Exit(code)
}

// newClient is a client of the test server with the dev token.
func newClient(t *testing.T) *Client {
	t.Helper()
	client, err := NewClient(serverURL, token)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

var queues atomic.Int64

// queueOf is a queue of the test's own, a new one on each call (go test
// -count=N runs a test again on the same server).
func queueOf(t *testing.T) string {
	return fmt.Sprintf("%s-%d", strings.NewReplacer("/", ".", " ", "_").Replace(t.Name()), queues.Add(1))
}

// waitJob polls jobID until done holds (the cap only turns a hang into a failure).
func waitJob(t *testing.T, client *Client, jobID string, done func(*Job) bool) *Job {
	t.Helper()
	until := time.Now().Add(cap)
	for {
		job, err := client.JobGet(context.Background(), jobID)
		if err != nil {
			t.Fatal(err)
		}
		if done(job) {
			return job
		}
		if time.Now().After(until) {
			t.Fatalf("job %s still %s (attempt %d) after %s", jobID, job.Status, job.Attempt, cap)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func terminal(job *Job) bool {
	return job.Status == StatusCompleted || job.Status == StatusFailed || job.Status == StatusCancelled
}

// closedClient is a client of a port nothing listens on.
func closedClient(t *testing.T) *Client {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	client, err := NewClient(fmt.Sprintf("http://127.0.0.1:%d", port), token)
	if err != nil {
		t.Fatal(err)
	}
	return client
}
