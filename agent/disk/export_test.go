package disk

import "testing"

// For the external tests (package disk_test) that run the boot on a real
// LUKS stage: a loop device and the loop kernel (no device-mapper here).

func NewLoopForTest(t testing.TB, size int64) string {
	requireRoot(t)
	return newLoop(t, size)
}

func NewLoopKernelForTest(t testing.TB) (Kernel, func()) {
	k := newLoopKernel(t)
	return k, k.powerOff
}

const TestDiskSize = testDiskSize
