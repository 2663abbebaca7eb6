package qftrio

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// A step run by the Go worker fans out a PDF's pages with Job.AddSteps, and the
// step that waited for it sees every thumbnail, in page order, against a real server.
func TestAddStepsFansOutAndTheWaitingStepFansIn(t *testing.T) {
	var refused []int
	handlers := map[string]Handler{
		"go-split": func(ctx context.Context, job *Job) (any, error) {
			pages := make([]WorkflowStepRequest, 30)
			for n := range pages {
				pages[n] = WorkflowStepRequest{Name: fmt.Sprintf("page-%d", n), Kind: "go-thumb", Payload: map[string]int{"page": n}}
			}
			grown, err := job.AddSteps(ctx, pages, "thumbs")
			if err != nil {
				return nil, err
			}
			if len(grown.Steps) != 32 {
				return nil, Permanent(fmt.Errorf("the workflow grew to %d steps", len(grown.Steps)))
			}
			if _, err := job.AddSteps(ctx, pages, "thumbs"); err != nil { // a repeat changes nothing
				return nil, err
			}
			var api *APIError
			if _, err := job.AddSteps(ctx, []WorkflowStepRequest{{Name: "page-0", Kind: "other"}}, ""); errors.As(err, &api) {
				refused = append(refused, api.Status)
			}
			return map[string]int{"pages": len(pages)}, nil
		},
		"go-thumb": func(ctx context.Context, job *Job) (any, error) {
			var payload struct{ Page int }
			if err := json.Unmarshal(job.Payload, &payload); err != nil {
				return nil, err
			}
			return map[string]string{"url": fmt.Sprintf("thumbs/%d.png", payload.Page)}, nil
		},
		"go-zip": func(ctx context.Context, job *Job) (any, error) {
			var seen struct{ Thumbs []struct{ URL string } }
			if err := json.Unmarshal(job.Context, &seen); err != nil {
				return nil, err
			}
			urls := make([]string, len(seen.Thumbs))
			for i, thumb := range seen.Thumbs {
				urls[i] = thumb.URL
			}
			return map[string][]string{"zipped": urls}, nil
		},
	}
	client := newClient(t)
	w := startWorker(t, "default", handlers, Options{Lanes: 4, LeaseSecs: 30})
	workflow, err := client.WorkflowCreate(context.Background(), "go-pdf", []WorkflowStepRequest{
		{Name: "split", Kind: "go-split"},
		{Name: "zip", Kind: "go-zip", DependsOn: []string{"split"}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(cap)
	for workflow.Status == "running" {
		if time.Now().After(until) {
			t.Fatalf("workflow %s still running after %s", workflow.ID, cap)
		}
		time.Sleep(20 * time.Millisecond)
		if workflow, err = client.WorkflowGet(context.Background(), workflow.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.stop(t); err != nil {
		t.Fatal(err)
	}
	var ended struct{ Zipped []string }
	if err := json.Unmarshal(workflow.Context, &ended); err != nil || workflow.Status != "completed" {
		t.Fatalf("the workflow ended %s with the context %s (%v)", workflow.Status, workflow.Context, err)
	}
	want := make([]string, 30)
	for n := range want {
		want[n] = fmt.Sprintf("thumbs/%d.png", n)
	}
	if !slices.Equal(ended.Zipped, want) || !slices.Equal(refused, []int{409}) {
		t.Fatalf("zipped %v, refused %v", ended.Zipped, refused)
	}
	for i, step := range workflow.Steps {
		if added := step.AddedBy != nil && *step.AddedBy == "split"; added != (i >= 2) {
			t.Errorf("step %s added by %v", step.Name, step.AddedBy)
		}
	}
}

func TestStepsAddWithAStaleTokenIsAConflictAndOutsideAHandlerAnError(t *testing.T) {
	ctx, client := context.Background(), newClient(t)
	workflow, err := client.WorkflowCreate(ctx, "go-stale", []WorkflowStepRequest{{Name: "only", Kind: "go-nobody"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer client.WorkflowCancel(ctx, workflow.ID)
	var api *APIError
	if _, err := client.StepsAdd(ctx, *workflow.Steps[0].JobID, "not-the-token", []WorkflowStepRequest{{Name: "x", Kind: "k"}}, ""); !errors.As(err, &api) || api.Status != 409 {
		t.Fatalf("a stale token is a 409, not %v", err)
	}
	if _, err := (&Job{}).AddSteps(ctx, nil, ""); err == nil {
		t.Fatal("AddSteps outside a handler is an error")
	}
}
