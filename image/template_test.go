// Package image holds no Go code: it is the image kit (install.sh, the
// mkosi fragment, the default agent.yaml). This test keeps the shipped
// config template in step with the agent's config parser.
package image

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/agent/config"
)

// settingLine matches a commented-out setting of the template ("#key: v"
// or "#  - item" / "#  key: v"), not its prose.
var settingLine = regexp.MustCompile(`^#([a-zA-Z]+:.*|  [-a-zA-Z].*)$`)

// TestTemplateAsShippedIsEmpty: the shipped file sets nothing, so an image
// configured through the kernel command line gets no surprises from it.
func TestTemplateAsShippedIsEmpty(t *testing.T) {
	c, err := config.LoadFile("agent.yaml", true)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Verifiers) != 0 || len(c.VerifierPins) != 0 || c.Role != "" || c.Disk.Device != "" {
		t.Fatalf("template sets values as shipped: %+v", c)
	}
}

// TestTemplateSettingsParse uncomments every setting and loads the result
// with the agent's strict parser (unknown keys are errors).
func TestTemplateSettingsParse(t *testing.T) {
	raw, err := os.ReadFile("agent.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var settings []string
	for _, line := range strings.Split(string(raw), "\n") {
		if m := settingLine.FindStringSubmatch(line); m != nil {
			settings = append(settings, m[1])
		}
	}
	path := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(path, []byte(strings.Join(settings, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := config.LoadFile(path, true)
	if err != nil {
		t.Fatalf("uncommented template does not parse: %v\n%s", err, strings.Join(settings, "\n"))
	}
	if len(c.Verifiers) != 2 || len(c.VerifierPins) != 1 || c.Disk.Device == "" || c.Timeout.Duration == 0 {
		t.Fatalf("uncommented template lost settings: %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("uncommented template does not validate: %v", err)
	}
}
