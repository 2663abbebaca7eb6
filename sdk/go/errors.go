package qftrio

import (
	"errors"
	"fmt"
	"time"
)

// The errors of a call, each a type usable with errors.As:
//
//	*APIError          the server answered 4xx/5xx: Status, Code, Message
//	*TransportError    no answer: connection refused or broken, timeout (Unwrap gives the cause)
//	*UnexpectedAnswer  an answer that is not qftrio's (another service at the URL)
//	*ConfigError       an argument that can never work (a bad URL, Lanes 0, ...)
//
// and what a handler returns to say how its job ends: Permanent(err),
// Snooze(d), RetryIn(d, err).

// APIError is an error answer of the server. Code is the error body's code
// (not_found, lease_lost, invalid, ...), "" when the answer had no qftrio
// error body (a proxy's page, say).
type APIError struct {
	Status  int
	Code    string
	Message string
}

func (e *APIError) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("%d: %s", e.Status, e.Message)
	}
	return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message)
}

// TransportError is a call that got no answer: the server could not be
// reached, the connection broke, or the call timed out. Sending the call again
// may succeed. Method and URL name the call.
type TransportError struct {
	Method string
	URL    string
	Err    error
}

func (e *TransportError) Error() string { return fmt.Sprintf("%s %s: %v", e.Method, e.URL, e.Err) }
func (e *TransportError) Unwrap() error { return e.Err }

// UnexpectedAnswer is an answer that is not a qftrio server's: not JSON, or
// not of the shape the route answers.
type UnexpectedAnswer struct {
	Method string
	URL    string
	Detail string
}

func (e *UnexpectedAnswer) Error() string {
	return fmt.Sprintf("%s %s: %s: is the URL a qftrio server?", e.Method, e.URL, e.Detail)
}

// ConfigError is an argument or option that can never work; nothing was sent.
type ConfigError struct{ Message string }

func (e *ConfigError) Error() string { return e.Message }

func configErrorf(format string, args ...any) error {
	return &ConfigError{Message: fmt.Sprintf(format, args...)}
}

// PermanentError, returned by a handler, fails its job with retryable false:
// dead-lettered at once. Make one with Permanent.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as not worth retrying: the handler's job fails with
// retryable false and err's text.
func Permanent(err error) error {
	if err == nil {
		err = errors.New("permanent error")
	}
	return &PermanentError{Err: err}
}

// SnoozeError, returned by a handler, puts its job back to pending for Delay
// without using up the attempt. Make one with Snooze.
type SnoozeError struct{ Delay time.Duration }

func (e *SnoozeError) Error() string { return fmt.Sprintf("snoozed for %s", e.Delay) }

// Snooze puts the handler's job back to pending for d (0 to 30 days) without
// using up its attempt (the server raises its max_attempts by one), so that a
// job can be snoozed any number of times.
func Snooze(d time.Duration) error { return &SnoozeError{Delay: d} }

// RetryInError, returned by a handler, fails the attempt with Err's text and
// has it retried after Delay. Make one with RetryIn.
type RetryInError struct {
	Delay time.Duration
	Err   error
}

func (e *RetryInError) Error() string { return e.Err.Error() }
func (e *RetryInError) Unwrap() error { return e.Err }

// RetryIn fails the handler's attempt with err's text and has it retried in d
// (0 to 30 days) instead of after the job's backoff (an upstream's
// Retry-After, say); the last attempt is dead-lettered all the same.
func RetryIn(d time.Duration, err error) error {
	if err == nil {
		err = errors.New("retry requested")
	}
	return &RetryInError{Delay: d, Err: err}
}
