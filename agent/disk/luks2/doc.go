// Package luks2 is the LUKS2 on-disk format of latchkey's state disk, and
// nothing else: the binary header fields and their checksum, the strict
// parse of the JSON metadata and its comparison with the one shape
// latchkey creates (keyslot, segment, digest, no tokens), the two
// keyslot areas a rewrap alternates between and the generation in the
// subsystem field, the keyslot cryptography (pbkdf2, AF split,
// aes-xts), the state record in the gap, and the layout arithmetic.
//
// It does no I/O: every function takes and returns bytes, so a header is
// judged on exactly the bytes the caller read, once, and the whole format
// can be tested and fuzzed without a device. agent/disk reads and writes
// the device, runs cryptsetup and holds the stage; a static test
// (scripts/layercheck/pure_test.go) keeps os, syscalls, exec and the
// network out of this package.
//
// Validate is the validator: it accepts exactly the headers latchkey's
// luksFormat writes (and the one transitional state of a rewrap cut
// short between its two header writes) and refuses everything else with
// ErrRejected and the path and value that differ.
package luks2
