package config_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/switchboard-relay/switchboard/internal/config"
)

func TestFieldError(t *testing.T) {
	errBad := errors.New("bad configuration")
	plain := config.Invalidf("broker", "PollWait", "must be positive")
	ref := config.Invalid("broker", "PickupTimeout", func(name func(string) string) string {
		return "must not exceed " + name("InactiveRequestTimeout")
	})
	ref.Err = errBad
	joined := fmt.Errorf("start: %w", errors.Join(plain, errors.New("other"), ref))

	if got, want := plain.Error(), "broker: PollWait must be positive"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	flags := func(field string) string { return "--" + strings.ToLower(field) }
	if got, want := ref.Message(flags), "--pickuptimeout must not exceed --inactiverequesttimeout"; got != want {
		t.Errorf("Message() = %q, want %q", got, want)
	}
	if fields := config.Fields(joined); len(fields) != 2 || fields[0] != plain || fields[1] != ref {
		t.Errorf("Fields found %v, want both field errors in order", fields)
	}
	if !errors.Is(joined, errBad) {
		t.Error("a FieldError's Err is not matched by errors.Is")
	}
	if config.Fields(errors.New("other")) != nil || config.Fields(nil) != nil {
		t.Error("Fields found errors where there are none")
	}
}
