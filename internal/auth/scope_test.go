package auth

import "testing"

func TestServiceScopes(t *testing.T) {
	user := Principal{Kind: KindUser, Devices: []string{"robot-7/ssh", "lab-*/db", "cam"}}
	for _, c := range []struct {
		device, service string
		whole, svc, any bool
	}{
		{"robot-7", "ssh", false, true, true},
		{"robot-7", "db", false, false, true},
		{"lab-2", "db", false, true, true},
		{"lab-2", "ssh", false, false, true},
		{"cam", "anything", true, true, true},
		{"other", "ssh", false, false, false},
		{"", "ssh", false, false, false},
	} {
		if got := user.Allows(c.device); got != c.whole {
			t.Errorf("Allows(%q) = %v", c.device, got)
		}
		if got := user.AllowsService(c.device, c.service); got != c.svc {
			t.Errorf("AllowsService(%q, %q) = %v", c.device, c.service, got)
		}
		if got := user.AllowsAny(c.device); got != c.any {
			t.Errorf("AllowsAny(%q) = %v", c.device, got)
		}
	}
	if (Principal{Kind: KindUser}).AllowsService("x", "ssh") != true {
		t.Error("a user token with no devices may not reach a service")
	}
	if (Principal{Kind: KindAgent, Devices: []string{"x"}}).AllowsService("x", "ssh") {
		t.Error("an agent token reaches a service")
	}
	for _, r := range []CreateRequest{
		{Kind: KindUser, Name: "a", Devices: []string{"robot/"}},
		{Kind: KindUser, Name: "a", Devices: []string{"robot/a/b"}},
		{Kind: KindUser, Name: "a", Devices: []string{"/ssh"}},
		{Kind: KindAgent, Devices: []string{"robot/ssh"}},
	} {
		if _, err := r.normalize(); err == nil {
			t.Errorf("%s token for %v accepted", r.Kind, r.Devices)
		}
	}
	if _, err := (CreateRequest{Kind: KindUser, Name: "a", Devices: []string{"robot-*/ssh"}}).normalize(); err != nil {
		t.Errorf("a user token for robot-*/ssh: %v", err)
	}
}
