package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
)

// burnForever spins on one core until the process is killed: the contended mode's CPU burner, run
// as a process of its own (startBurner) so that it competes with every process of the machine the
// same way, the bench's own included.
func burnForever() {
	runtime.GOMAXPROCS(1)
	x := uint64(1)
	for {
		x = x*6364136223846793005 + 1442695040888963407
		if x == 0 {
			fmt.Println(x) // never: keeps the loop from being optimized away
		}
	}
}

// startBurner starts the CPU burner (this program with -burn) and returns what stops it.
func startBurner() (stop func(), err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("start the CPU burner: %w", err)
	}
	cmd := exec.Command(self, "-burn")
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the CPU burner: %w", err)
	}
	return func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }, nil
}
