package qftrio

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// EventsFilter chooses the events of a stream: the tenant's jobs of Queue,
// Kind or Job (each optional), and with StatsSecs (1 to 60) each named
// queue's stats that often.
type EventsFilter struct {
	Queue, Kind, Job string
	StatsSecs        int
}

// StreamEvent is one server-sent event: Kind is "job", "stats" or "overflow", Data
// its JSON (a job change {id, queue, kind, status, attempt, progress, at}, a
// queue's stats).
type StreamEvent struct {
	Kind string
	Data json.RawMessage
}

// EventStream reads a stream that Events opened; Close it when done.
type EventStream struct {
	body    io.ReadCloser
	scanner *bufio.Scanner
}

// Events opens GET /api/v1/events, the tenant's live job changes from any
// server. It is a live feed, not a log: nothing is replayed, and a reader
// that falls behind gets an "overflow" event, after which the stream ends.
// Cancelling ctx ends it too.
func (c *Client) Events(ctx context.Context, filter EventsFilter) (*EventStream, error) {
	r := routes["events"]
	query := url.Values{}
	for key, value := range map[string]string{"queue": filter.Queue, "kind": filter.Kind, "job": filter.Job} {
		if value != "" {
			query.Set(key, value)
		}
	}
	if filter.StatsSecs != 0 {
		query.Set("stats_secs", strconv.Itoa(filter.StatsSecs))
	}
	where := c.URL + r.path
	if len(query) > 0 {
		where += "?" + query.Encode()
	}
	request, err := http.NewRequestWithContext(ctx, r.method, where, nil)
	if err != nil {
		return nil, configErrorf("%s %s: %v", r.method, where, err)
	}
	for key, values := range c.header {
		request.Header[key] = values
	}
	response, err := c.HTTP.Do(request)
	if err != nil {
		var urlError *url.Error
		if errors.As(err, &urlError) {
			err = urlError.Err
		}
		return nil, &TransportError{Method: r.method, URL: where, Err: err}
	}
	if response.StatusCode >= 400 {
		defer response.Body.Close()
		text, _ := io.ReadAll(io.LimitReader(response.Body, maxAnswerBytes))
		return nil, apiError(response, text)
	}
	scanner := bufio.NewScanner(response.Body)
	scanner.Buffer(make([]byte, 64*1024), maxAnswerBytes)
	return &EventStream{body: response.Body, scanner: scanner}, nil
}

// Next reads the next event; io.EOF once the stream has ended.
func (s *EventStream) Next() (*StreamEvent, error) {
	var kind string
	var data []string
	for s.scanner.Scan() {
		line := s.scanner.Text()
		switch {
		case line == "":
			if kind != "" || data != nil {
				if kind == "" {
					kind = "message"
				}
				return &StreamEvent{Kind: kind, Data: json.RawMessage(strings.Join(data, "\n"))}, nil
			}
		case strings.HasPrefix(line, ":"): // a keep-alive comment
		case strings.HasPrefix(line, "event:"):
			kind = strings.TrimSpace(line[len("event:"):])
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(line[len("data:"):], " "))
		}
	}
	if err := s.scanner.Err(); err != nil {
		return nil, err
	}
	return nil, io.EOF
}

// Close ends the stream.
func (s *EventStream) Close() error { return s.body.Close() }
