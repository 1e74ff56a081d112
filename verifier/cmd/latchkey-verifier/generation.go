package main

import (
	"flag"
	"fmt"
	"strconv"

	"github.com/latchkey/latchkey/verifier/keys"
)

// optionalUint is a flag that remembers whether it was given.
type optionalUint struct {
	set bool
	v   uint32
}

func (o *optionalUint) String() string {
	if !o.set {
		return ""
	}
	return strconv.FormatUint(uint64(o.v), 10)
}

func (o *optionalUint) Set(s string) error {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n > keys.MaxGeneration {
		return fmt.Errorf("want a generation number from 0 to %d", keys.MaxGeneration)
	}
	o.set, o.v = true, uint32(n)
	return nil
}

func generationFlag(fs *flag.FlagSet) *optionalUint {
	o := &optionalUint{}
	fs.Var(o, "generation", "master-secret generation the disk's header names (cryptsetup luksDump DEVICE: Subsystem latchkey-g<N>, none is 0); "+
		"required when masterSecrets lists more than one")
	return o
}

// recoveryGeneration picks the generation recover-key derives under: the
// one given, or the only one configured. With several configured and none
// given it refuses rather than guess: a key of the wrong generation opens
// nothing, and the header says which one is right.
func recoveryGeneration(d *keys.Deriver, o *optionalUint) (uint32, error) {
	gens := d.Generations()
	switch {
	case o.set && !d.Serves(o.v):
		return 0, fmt.Errorf("generation %d is not in masterSecrets (configured: %s)", o.v, listGenerations(gens))
	case o.set:
		return o.v, nil
	case len(gens) == 1:
		return gens[0].Generation, nil
	}
	return 0, fmt.Errorf("masterSecrets lists generations %s: say which one with --generation N, the one the disk's header names "+
		"(`cryptsetup luksDump DEVICE`: Subsystem latchkey-g<N>; no subsystem is generation 0)", listGenerations(gens))
}

func listGenerations(gens []keys.GenerationInfo) string {
	s := ""
	for i, g := range gens {
		if i > 0 {
			s += ", "
		}
		s += strconv.FormatUint(uint64(g.Generation), 10)
	}
	return s
}
