package qftrio

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The example worker and the conformance adapter as a user runs them: built
// with go build, started as processes, stopped with signals.

// build builds the package at dir (relative to the module) and answers the binary's path.
func build(t *testing.T, dir string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), filepath.Base(dir))
	if output, err := exec.Command("go", "build", "-o", out, dir).CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", dir, err, output)
	}
	return out
}

type process struct {
	cmd    *exec.Cmd
	stdout *syncBuffer
	stderr *syncBuffer
	end    chan error
}

func startProcess(t *testing.T, bin string, env ...string) *process {
	t.Helper()
	p := &process{cmd: exec.Command(bin), stdout: &syncBuffer{}, stderr: &syncBuffer{}, end: make(chan error, 1)}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.end <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.end
		p.end <- nil
	})
	return p
}

// waitOutput waits until the process has printed a line holding text (the
// cap only turns a hang into a failure), and answers that line.
func (p *process) waitOutput(t *testing.T, out *syncBuffer, text string) string {
	t.Helper()
	until := time.Now().Add(cap)
	for {
		for _, line := range strings.Split(out.String(), "\n") {
			if strings.Contains(line, text) {
				return line
			}
		}
		if time.Now().After(until) {
			t.Fatalf("no line with %q after %s:\n%s\n%s", text, cap, p.stdout.String(), p.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exitCode signals the process with sig and answers its exit status.
func (p *process) exitCode(t *testing.T, sig syscall.Signal) int {
	t.Helper()
	_ = p.cmd.Process.Signal(sig)
	select {
	case err := <-p.end:
		p.end <- err
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(cap):
		t.Fatalf("the process did not exit within %s of %s:\n%s", cap, sig, p.stderr.String())
		return -1
	}
}

func TestExampleWorkerRunsAsWritten(t *testing.T) {
	bin, queue := build(t, "./examples/worker"), queueOf(t)
	worker := startProcess(t, bin, "QFTRIO_URL="+serverURL, "WORKER_QUEUE="+queue, "WORKER_ID=alpha", "WORKER_LANES=2")
	first := enqueue(t, "work", queue, map[string]int{"n": 1}, JobConfig{})
	second := enqueue(t, "work", queue, map[string]int{"n": 2}, JobConfig{})
	for _, job := range []*Job{first, second} {
		got := waitJob(t, newClient(t), job.ID, terminal)
		if got.Status != StatusCompleted || string(got.Result) != `{"attempt":1,"handledBy":"alpha"}` {
			t.Errorf("the example's job: %s %s", got.Status, got.Result)
		}
	}
	worker.waitOutput(t, worker.stdout, "completed "+second.ID)
	if code := worker.exitCode(t, syscall.SIGTERM); code != 0 {
		t.Errorf("a drained example exits 0, not %d:\n%s", code, worker.stderr.String())
	}
	worker.waitOutput(t, worker.stdout, "stopping finishing 0 held job(s)")
}

// The drill of docs/sdk-go.md: kill a worker holding a job, and another
// finishes it once the lease runs out.
func TestKilledWorkersJobRunsElsewhere(t *testing.T) {
	bin, queue := build(t, "./examples/worker"), queueOf(t)
	env := []string{"QFTRIO_URL=" + serverURL, "WORKER_QUEUE=" + queue, "WORKER_LANES=1", "WORKER_LEASE_SECS=2"}
	alpha := startProcess(t, bin, append(env, "WORKER_ID=alpha")...)
	job := enqueue(t, "work", queue, nil, JobConfig{})
	alpha.waitOutput(t, alpha.stdout, "claimed "+job.ID)
	_ = alpha.cmd.Process.Signal(syscall.SIGKILL)
	<-alpha.end
	alpha.end <- nil
	beta := startProcess(t, bin, append(env, "WORKER_ID=beta")...)
	got := waitJob(t, newClient(t), job.ID, terminal)
	if got.Status != StatusCompleted || string(got.Result) != `{"attempt":2,"handledBy":"beta"}` {
		t.Errorf("the killed worker's job: %s %s", got.Status, got.Result)
	}
	if code := beta.exitCode(t, syscall.SIGTERM); code != 0 {
		t.Errorf("beta exits 0 after a drain, not %d", code)
	}
}

func TestAdapterSignals(t *testing.T) {
	bin, queue := build(t, "./cmd/qftrio-conformance"), queueOf(t)
	env := []string{"QFTRIO_URL=" + serverURL, "QFTRIO_TOKEN=" + token, "ADAPTER_QUEUE=" + queue, "ADAPTER_LANES=2",
		"ADAPTER_LEASE_SECS=30", "ADAPTER_WAIT_SECS=1", "ADAPTER_WORKER_ID=go-adapter"}
	// The first signal drains: the held job finishes and is reported.
	adapter := startProcess(t, bin, env...)
	adapter.waitOutput(t, adapter.stdout, `"ready"`)
	short := enqueue(t, "sleep", queue, map[string]float64{"secs": 0.5}, JobConfig{})
	adapter.waitOutput(t, adapter.stdout, `"started"`)
	_ = adapter.cmd.Process.Signal(syscall.SIGTERM)
	if code := adapter.exitCode(t, syscall.Signal(0)); code != 0 {
		t.Fatalf("a drained adapter exits 0, not %d:\n%s", code, adapter.stderr.String())
	}
	var stopped map[string]any
	line := adapter.waitOutput(t, adapter.stdout, `"stopped"`)
	if err := json.Unmarshal([]byte(line), &stopped); err != nil || stopped["error"] != nil {
		t.Errorf("the adapter's last line: %s", line)
	}
	if got, _ := newClient(t).JobGet(context.Background(), short.ID); got.Status != StatusCompleted {
		t.Errorf("the job held at the first signal is finished: %s", got.Status)
	}
	// The second quits at once, the held job abandoned to its lease.
	adapter = startProcess(t, bin, env...)
	long := enqueue(t, "sleep", queue, map[string]float64{"secs": 3600}, JobConfig{})
	adapter.waitOutput(t, adapter.stdout, `"started"`)
	_ = adapter.cmd.Process.Signal(syscall.SIGTERM)
	adapter.waitOutput(t, adapter.stderr, "stopping")
	if code := adapter.exitCode(t, syscall.SIGTERM); code != 130 {
		t.Errorf("a second signal quits with 130, not %d", code)
	}
	if got, _ := newClient(t).JobGet(context.Background(), long.ID); got.Status != StatusRunning {
		t.Errorf("the abandoned job stays running until its lease ends: %s", got.Status)
	}
}

func TestDocsShowTheExampleAsItIs(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "sdk-go.md"))
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile(filepath.Join("examples", "worker", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "```go\n"+string(example)+"```\n") {
		t.Error("docs/sdk-go.md does not show examples/worker/main.go as it is")
	}
	methods := reflect.TypeOf(&Client{})
	for i := 0; i < methods.NumMethod(); i++ {
		name := methods.Method(i).Name
		if !strings.Contains(string(doc), "`"+name+"(") && !strings.Contains(string(doc), " "+name+"(") && !strings.Contains(string(doc), "`"+name+"`") {
			t.Errorf("docs/sdk-go.md does not name the client's %s", name)
		}
	}
}
