// Package config holds what every component's Config shares: the error its
// Validate returns for a field that cannot work. The error speaks in the
// component's words (its Config's field names); the command line renders
// the same error with its flags' names instead, from one table, so that a
// component never needs to know the flags that fill it.
//
//	func (c *Config) Validate() error {
//		var errs []error
//		if c.PollWait <= 0 {
//			errs = append(errs, config.Invalidf("broker", "PollWait", "must be positive"))
//		}
//		return errors.Join(errs...)
//	}
//
// reads "broker: PollWait must be positive" from the component, and
// "--poll-wait must be positive" from the command line.
package config

import (
	"errors"
	"fmt"
)

// FieldError is a field of a component's Config that cannot work.
type FieldError struct {
	// Component names the component whose Config holds the field, as in
	// its package name: "broker", "node", "agent".
	Component string
	// Field is the Config field's name, "PollWait"; a nested field is
	// written with dots, "Credentials.User".
	Field string
	// Err, if set, is matched by errors.Is: a component's sentinel for
	// every error of its Validate (store.ErrInvalidConfig).
	Err error
	// problem says what is wrong and what to do, after the field's name;
	// other fields it names are written by name.
	problem func(name func(field string) string) string
}

// Invalidf returns the error for field of component's Config; the problem,
// formatted, follows the field's name: Invalidf("broker", "PollWait", "must
// be positive").
func Invalidf(component, field, format string, args ...any) *FieldError {
	msg := fmt.Sprintf(format, args...)
	return &FieldError{Component: component, Field: field, problem: func(func(string) string) string { return msg }}
}

// Invalid is Invalidf for a problem that names other fields of the same
// Config: problem writes each with name, so that the command line shows
// its flags instead.
func Invalid(component, field string, problem func(name func(field string) string) string) *FieldError {
	return &FieldError{Component: component, Field: field, problem: problem}
}

// Error reads in the component's words: "broker: PollWait must be positive".
func (e *FieldError) Error() string {
	return e.Component + ": " + e.Field + " " + e.problem(fieldName)
}

// Message renders the error with name giving each field's name, e.g. the
// flag that fills it: "--poll-wait must be positive". The component is not
// named.
func (e *FieldError) Message(name func(field string) string) string {
	return name(e.Field) + " " + e.problem(name)
}

// Unwrap returns Err.
func (e *FieldError) Unwrap() error { return e.Err }

func fieldName(field string) string { return field }

// Fields returns every FieldError in err, which may join several (as
// errors.Join does) or wrap one.
func Fields(err error) []*FieldError {
	var out []*FieldError
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case nil:
		case *FieldError:
			out = append(out, e)
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				walk(inner)
			}
		default:
			walk(errors.Unwrap(err))
		}
	}
	walk(err)
	return out
}
