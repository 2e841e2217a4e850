//go:build !linux

package main

import (
	"errors"
	"fmt"
	"os"
)

// A node needs Linux (cgroups, mounts, network namespaces); elsewhere `up --node` and `node-clean` say so.

func saveSysctls() error        { return errors.New("node: needs Linux") }
func cleanNode() []string       { return nil }
func nodeLeftovers() []string   { return nil }
func runNodeClean([]string) int { fmt.Fprintln(os.Stderr, "node-clean: needs Linux"); return 1 }
