package tdx

import (
	"encoding/json"
	"testing"

	"github.com/google/go-tdx-guest/pcs"
	"github.com/google/go-tdx-guest/testing/testdata"
)

// TestMatchLevel selects TCB levels of Intel's recorded TCB info for
// FMSPC 50806f000000 (UpToDate at PCESVN 11, OutOfDate at PCESVN 5, both
// at CPUSVN 05050202030100030000000000000000 and TDX components
// 03000500000000000000000000000000).
func TestMatchLevel(t *testing.T) {
	var info pcs.TdxTcbInfo
	if err := json.Unmarshal(testdata.TcbInfoBody, &info); err != nil {
		t.Fatal(err)
	}
	levels := info.TcbInfo.TcbLevels
	cpu := []byte{5, 5, 2, 2, 3, 1, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0}
	tee := []byte{3, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	lowCPU := []byte{3, 3, 2, 2, 2, 1, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0}
	lowTee := []byte{3, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	// A module with a major version skips TDX components 0 and 1.
	majorTee := []byte{0, 1, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	tests := []struct {
		name string
		cpu  []byte
		pce  uint16
		tee  []byte
		want pcs.TcbComponentStatus
	}{
		{"current", cpu, 11, tee, pcs.TcbComponentStatusUpToDate},
		{"newer PCE", cpu, 13, tee, pcs.TcbComponentStatusUpToDate},
		{"old PCE", cpu, 10, tee, pcs.TcbComponentStatusOutOfDate},
		{"PCE below every level", cpu, 4, tee, NoTCBLevel},
		{"CPUSVN below every level", lowCPU, 11, tee, NoTCBLevel},
		{"TEE_TCB_SVN below every level", cpu, 11, lowTee, NoTCBLevel},
		{"module major version", cpu, 11, majorTee, pcs.TcbComponentStatusUpToDate},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := NoTCBLevel
			if l := matchLevel(levels, tc.tee, tc.pce, tc.cpu); l != nil {
				got = l.TcbStatus
			}
			if got != tc.want {
				t.Errorf("status %s, want %s", got, tc.want)
			}
		})
	}
}

func TestModuleStatus(t *testing.T) {
	ids := []pcs.TdxModuleIdentity{{ID: "TDX_01", TcbLevels: []pcs.TcbLevel{
		{Tcb: pcs.Tcb{Isvsvn: 4}, TcbStatus: pcs.TcbComponentStatusUpToDate},
		{Tcb: pcs.Tcb{Isvsvn: 2}, TcbStatus: pcs.TcbComponentStatusOutOfDate},
	}}}
	for _, tc := range []struct {
		svn  []byte
		want pcs.TcbComponentStatus
	}{
		{[]byte{5, 1}, pcs.TcbComponentStatusUpToDate},
		{[]byte{3, 1}, pcs.TcbComponentStatusOutOfDate},
		{[]byte{1, 1}, NoTCBLevel},
		{[]byte{9, 2}, NoTCBLevel}, // no TDX_02 identity
	} {
		if got := moduleStatus(ids, tc.svn); got != tc.want {
			t.Errorf("svn %v: %s, want %s", tc.svn, got, tc.want)
		}
	}
}
