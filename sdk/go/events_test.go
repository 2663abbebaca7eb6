package qftrio

import (
	"context"
	"encoding/json"
	"testing"
	"time"
)

func TestEventsStreamsAJobsChanges(t *testing.T) {
	client := newClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	queue := queueOf(t)
	stream, err := client.Events(ctx, EventsFilter{Queue: queue})
	if err != nil {
		t.Fatalf("Events: %v", err)
	}
	defer stream.Close()
	job, err := client.Enqueue(ctx, "echo", map[string]any{}, &JobConfig{Queue: queue})
	if err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	if _, err := client.JobCancel(ctx, job.ID); err != nil {
		t.Fatalf("JobCancel: %v", err)
	}
	var statuses []string
	for len(statuses) < 2 {
		event, err := stream.Next()
		if err != nil {
			t.Fatalf("Next after %v: %v", statuses, err)
		}
		var change struct{ ID, Status string }
		if event.Kind != "job" || json.Unmarshal(event.Data, &change) != nil || change.ID != job.ID {
			continue
		}
		statuses = append(statuses, change.Status)
	}
	if statuses[0] != "pending" || statuses[1] != "cancelled" {
		t.Fatalf("the job's events: %v", statuses)
	}
}
