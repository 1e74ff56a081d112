package tpmtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// template is a manufactured TPM state, held in memory, and the CA that
// issued its EK certificates.
type template struct {
	state map[string][]byte // file name -> content of the swtpm state dir
	caPEM []string
}

// manufacture runs swtpm_setup in dir with a throwaway swtpm_localca whose
// configuration, keys and serial file all live under dir, so nothing under
// /etc, /var/lib or $HOME is read for the CA or written.
func manufacture(dir string) (*template, error) {
	if err := lookTools(); err != nil {
		return nil, err
	}
	caDir := filepath.Join(dir, "ca")
	stateDir := filepath.Join(dir, "state")
	for _, d := range []string{caDir, stateDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	setupConf, err := writeConfigs(dir, caDir)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("swtpm_setup", "--tpm2",
		"--tpmstate", stateDir,
		"--config", setupConf,
		"--create-ek-cert", "--create-platform-cert",
		"--pcr-banks", "sha256",
		"--overwrite")
	// XDG_CONFIG_HOME and HOME point into dir so no user configuration
	// of the machine can change what is manufactured.
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+dir, "HOME="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("swtpm_setup: %w: %s", err, out)
	}
	caPEM, err := readCA(caDir)
	if err != nil {
		return nil, err
	}
	state, err := readDir(stateDir)
	if err != nil {
		return nil, err
	}
	return &template{state: state, caPEM: caPEM}, nil
}

// writeConfigs writes the swtpm_setup, swtpm-localca and localca options
// files and returns the swtpm_setup one.
func writeConfigs(dir, caDir string) (string, error) {
	files := map[string]string{
		"swtpm-localca.conf": strings.Join([]string{
			"statedir = " + caDir,
			"signingkey = " + filepath.Join(caDir, "signkey.pem"),
			"issuercert = " + filepath.Join(caDir, "issuercert.pem"),
			"certserial = " + filepath.Join(caDir, "certserial"),
		}, "\n") + "\n",
		"swtpm-localca.options": "--platform-manufacturer latchkey\n--platform-version 1.0\n--platform-model tpmtest\n",
		"swtpm_setup.conf": strings.Join([]string{
			"create_certs_tool = swtpm_localca",
			"create_certs_tool_config = " + filepath.Join(dir, "swtpm-localca.conf"),
			"create_certs_tool_options = " + filepath.Join(dir, "swtpm-localca.options"),
			"active_pcr_banks = sha256",
		}, "\n") + "\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			return "", err
		}
	}
	return filepath.Join(dir, "swtpm_setup.conf"), nil
}

// readCA returns the local CA's root and issuing certificates, which
// swtpm_localca creates on first use.
func readCA(caDir string) ([]string, error) {
	var pems []string
	for _, name := range []string{"swtpm-localca-rootca-cert.pem", "issuercert.pem"} {
		b, err := os.ReadFile(filepath.Join(caDir, name))
		if err != nil {
			return nil, fmt.Errorf("read local ca: %w", err)
		}
		pems = append(pems, string(b))
	}
	return pems, nil
}

// readDir reads the regular files of dir (swtpm's state is flat), leaving
// out lock files.
func readDir(dir string) (map[string][]byte, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	files := make(map[string][]byte, len(entries))
	for _, e := range entries {
		if !e.Type().IsRegular() || strings.HasPrefix(e.Name(), ".lock") {
			continue
		}
		if files[e.Name()], err = os.ReadFile(filepath.Join(dir, e.Name())); err != nil {
			return nil, err
		}
	}
	return files, nil
}

// writeDir creates dir holding files.
func writeDir(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o600); err != nil {
			return err
		}
	}
	return nil
}
