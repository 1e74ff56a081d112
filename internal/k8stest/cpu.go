package k8stest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Components are the control-plane processes scripts/controlplane.sh
// starts, by the name of their pid file in LATCHKEY_K8S_DIR.
var Components = []string{"etcd", "kube-apiserver", "kube-controller-manager"}

// CPU returns the user+system CPU time each control-plane component has
// used so far (from /proc, the kernel's accounting of the process and its
// direct children), so a benchmark can say where the time of a run went:
// the difference of two calls is the CPU of what happened in between.
func (e Env) CPU() (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	for _, name := range Components {
		b, err := os.ReadFile(filepath.Join(e["LATCHKEY_K8S_DIR"], name+".pid"))
		if err != nil {
			return nil, err
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return nil, fmt.Errorf("%s.pid: %w", name, err)
		}
		d, err := ProcessCPU(pid)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out[name] = d
	}
	return out, nil
}

// ProcessCPU is the user+system time of process pid and of its direct
// children (a setsid or netns wrapper's), from /proc/PID/stat.
func ProcessCPU(pid int) (time.Duration, error) {
	total, err := statCPU(pid)
	if err != nil {
		return 0, err
	}
	kids, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	for _, f := range strings.Fields(string(kids)) {
		if c, err := strconv.Atoi(f); err == nil {
			if d, err := statCPU(c); err == nil {
				total += d
			}
		}
	}
	return total, nil
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

func statCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the name", pid, len(f))
	}
	var ticks int64
	for _, field := range f[11:13] { // utime, stime (fields 14 and 15)
		n, err := strconv.ParseInt(field, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += n
	}
	return time.Duration(ticks) * (time.Second / clockTicks), nil
}
