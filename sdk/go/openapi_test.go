package qftrio

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
)

// The SDK's routes and wire types against the server's own /openapi.json:
// they fail here as soon as they drift from what the server serves.

// wireTypes are the SDK's types by the schema title they stand for.
var wireTypes = map[string]any{
	// Answers: exactly the schema's fields.
	"JobAnswer":             Job{},
	"ErrorEntryAnswer":      ErrorEntry{},
	"AttemptEntryAnswer":    AttemptEntry{},
	"LeaseAnswer":           Lease{},
	"LeasesAnswer":          leasesAnswer{},
	"HeartbeatAnswer":       HeartbeatAnswer{},
	"ReportResultAnswer":    ReportResult{},
	"ReportResultsAnswer":   reportResultsAnswer{},
	"JobsAnswer":            jobsAnswer{},
	"JobsPageAnswer":        JobsPage{},
	"CountAnswer":           countAnswer{},
	"QueueStatsAnswer":      QueueStats{},
	"CountsAnswer":          Counts{},
	"HeldBackAnswer":        HeldBack{},
	"QueuesAnswer":          QueuesPage{},
	"WorkerAnswer":          WorkerInfo{},
	"WorkersAnswer":         workersAnswer{},
	"RateLimitAnswer":       RateLimit{},
	"RateLimitsAnswer":      rateLimitsAnswer{},
	"ScheduleAnswer":        Schedule{},
	"SchedulesAnswer":       SchedulesPage{},
	"ScheduleTriggerAnswer": ScheduleTriggered{},
	"WorkflowAnswer":        Workflow{},
	"WorkflowStepAnswer":    WorkflowStep{},
	"WorkflowsPageAnswer":   WorkflowsPage{},
	"HealthAnswer":          Health{},
	// Requests: no field the server refuses, every one it requires.
	"LeaseRequest":          LeaseRequest{},
	"HeartbeatRequest":      heartbeatRequest{},
	"ProgressRequest":       progressRequest{},
	"CompleteRequest":       completeRequest{},
	"FailRequest":           failRequest{},
	"SnoozeRequest":         snoozeRequest{},
	"HeartbeatManyRequest":  heartbeatManyRequest{},
	"HeartbeatManyItem":     HeartbeatItem{},
	"CompleteManyRequest":   completeManyRequest{},
	"CompleteManyItem":      CompleteItem{},
	"FailManyRequest":       failManyRequest{},
	"FailManyItem":          FailItem{},
	"SnoozeManyRequest":     snoozeManyRequest{},
	"SnoozeManyItem":        SnoozeItem{},
	"EnqueueRequest":        EnqueueRequest{},
	"EnqueueBatchRequest":   enqueueBatchRequest{},
	"JobConfig":             JobConfig{},
	"BackoffConfig":         Backoff{},
	"ConcurrencyConfig":     Concurrency{},
	"UniqueConfig":          Unique{},
	"BulkRetryRequest":      BulkFilter{},
	"BulkCancelRequest":     BulkFilter{},
	"BulkDeleteRequest":     BulkFilter{},
	"RateLimitRequest":      rateLimitRequest{},
	"ScheduleRequest":       ScheduleRequest{},
	"WorkflowCreateRequest": workflowCreateRequest{},
	"StepsAddRequest":       stepsAddRequest{},
	"WorkflowStepRequest":   WorkflowStepRequest{},
}

type schema struct {
	Ref        string             `json:"$ref"`
	Title      string             `json:"title"`
	Type       string             `json:"type"`
	AnyOf      []*schema          `json:"anyOf"`
	Properties map[string]*schema `json:"properties"`
	Required   []string           `json:"required"`
	Items      *schema            `json:"items"`
}

type operation struct {
	Parameters []struct {
		In   string `json:"in"`
		Name string `json:"name"`
	} `json:"parameters"`
	RequestBody *struct {
		Content map[string]struct {
			Schema *schema `json:"schema"`
		} `json:"content"`
	} `json:"requestBody"`
	Responses map[string]struct {
		Content map[string]struct {
			Schema *schema `json:"schema"`
		} `json:"content"`
	} `json:"responses"`
}

type document struct {
	Paths      map[string]map[string]operation `json:"paths"`
	Components struct {
		Schemas map[string]*schema `json:"schemas"`
	} `json:"components"`
}

// fetchDocument reads the server's /openapi.json, typed and as plain JSON.
func fetchDocument(t *testing.T) (*document, any) {
	t.Helper()
	response, err := http.Get(serverURL + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer response.Body.Close()
	data, err := io.ReadAll(response.Body)
	if err != nil {
		t.Fatal(err)
	}
	var doc document
	var raw any
	if err := errors.Join(json.Unmarshal(data, &doc), json.Unmarshal(data, &raw)); err != nil {
		t.Fatal(err)
	}
	return &doc, raw
}

func (d *document) deref(s *schema) *schema {
	if s.Ref == "" {
		return s
	}
	return d.Components.Schemas[strings.TrimPrefix(s.Ref, "#/components/schemas/")]
}

func (d *document) allowsNull(s *schema) bool {
	s = d.deref(s)
	return s.Type == "null" || slices.ContainsFunc(s.AnyOf, d.allowsNull)
}

// jsonFields are the JSON names of a struct's exported fields, with their types.
func jsonFields(v any) map[string]reflect.Type {
	fields := map[string]reflect.Type{}
	typ := reflect.TypeOf(v)
	for i := 0; i < typ.NumField(); i++ {
		field := typ.Field(i)
		if !field.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(field.Tag.Get("json"), ",")
		fields[name] = field.Type
	}
	return fields
}

func nullable(typ reflect.Type) bool {
	switch typ.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Interface:
		return true
	}
	return false
}

// check compares the SDK's type of title with s: an answer's type declares
// exactly the schema's fields (a pointer, map, slice or raw JSON where the
// server may send null); a request's sends no field the server refuses and
// every one it requires.
func (d *document) check(title string, s *schema, problems *[]string) {
	v, ok := wireTypes[title]
	if !ok {
		*problems = append(*problems, title+": no type of the SDK stands for it")
		return
	}
	s = d.deref(s)
	where := reflect.TypeOf(v).Name() + " (" + title + ")"
	fields := jsonFields(v)
	answer := strings.HasSuffix(title, "Answer")
	for name, typ := range fields {
		prop, ok := s.Properties[name]
		if !ok {
			*problems = append(*problems, where+"."+name+": the server has no such field")
		} else if answer && d.allowsNull(prop) && !nullable(typ) {
			*problems = append(*problems, where+"."+name+": the server may send null, the SDK's "+typ.String()+" cannot hold it")
		}
	}
	for name := range s.Properties {
		if _, ok := fields[name]; !ok && (answer || slices.Contains(s.Required, name)) {
			*problems = append(*problems, where+"."+name+": the server sends or requires this field; the SDK lacks it")
		}
	}
}

func TestEveryRouteIsTheServers(t *testing.T) {
	doc, _ := fetchDocument(t)
	var problems []string
	for name, r := range routes {
		op, ok := doc.Paths[r.path][strings.ToLower(r.method)]
		if !ok {
			problems = append(problems, name+": the server has no "+r.method+" "+r.path)
			continue
		}
		var query []string
		for _, p := range op.Parameters {
			if p.In == "query" {
				query = append(query, p.Name)
			}
		}
		sort.Strings(query)
		declared := slices.Clone(r.query)
		sort.Strings(declared)
		if !slices.Equal(query, declared) {
			problems = append(problems, name+": the server takes the query "+strings.Join(query, ", ")+", the SDK "+strings.Join(declared, ", "))
		}
		var body *schema
		if op.RequestBody != nil {
			body = op.RequestBody.Content["application/json"].Schema
		}
		switch {
		case r.request != "" && body == nil:
			problems = append(problems, name+": the server takes no body")
		case r.request != "":
			doc.check(r.request, body, &problems)
		case body != nil && len(doc.deref(body).Required) > 0:
			problems = append(problems, name+": the server requires a body, the SDK sends none")
		}
		for code, response := range op.Responses {
			if !strings.HasPrefix(code, "2") {
				continue
			}
			if r.answer == streamAnswer {
				if _, ok := response.Content["text/event-stream"]; !ok {
					problems = append(problems, name+": the server answers "+code+" with no event stream")
				}
				continue
			}
			switch content, ok := response.Content["application/json"]; {
			case r.answer == "" && code != "204":
				problems = append(problems, name+": the server answers "+code+", the SDK expects 204")
			case r.answer == "":
			case !ok || content.Schema == nil:
				problems = append(problems, name+": the server answers "+code+" with no JSON")
			default:
				doc.check(r.answer, content.Schema, &problems)
			}
		}
	}
	for _, p := range slices.Compact(sorted(problems)) {
		t.Error(p)
	}
}

func TestEveryRouteOfTheServerHasAMethod(t *testing.T) {
	doc, _ := fetchDocument(t)
	declared := map[string]bool{}
	for _, r := range routes {
		declared[r.method+" "+r.path] = true
	}
	for path, ops := range doc.Paths {
		for method := range ops {
			// Prometheus text is for scrapers, not for a client.
			if route := strings.ToUpper(method) + " " + path; route != "GET /metrics" && !declared[route] {
				t.Errorf("%s: the server serves it, the SDK has no method for it", route)
			}
		}
	}
}

func TestEveryWireTypeMatchesTheServersSchema(t *testing.T) {
	doc, raw := fetchDocument(t)
	titled := map[string]*schema{}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case []any:
			for _, item := range v {
				walk(item)
			}
		case map[string]any:
			if title, ok := v["title"].(string); ok && v["properties"] != nil && titled[title] == nil {
				data, _ := json.Marshal(v)
				var s schema
				_ = json.Unmarshal(data, &s)
				titled[title] = &s
			}
			for _, item := range v {
				walk(item)
			}
		}
	}
	walk(raw)
	var problems []string
	for title := range wireTypes {
		if s, ok := titled[title]; ok {
			doc.check(title, s, &problems)
		} else {
			problems = append(problems, title+": the server's document has no schema of that title")
		}
	}
	for _, p := range slices.Compact(sorted(problems)) {
		t.Error(p)
	}
}

func sorted(items []string) []string {
	sort.Strings(items)
	return items
}
