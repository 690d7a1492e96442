package main

import (
	"context"
	"testing"
)

// TestDemoCapture replays the embedded capture; runDemo itself checks that the large transaction
// arrives whole, with every row kept by its savepoints, and that the capture ends with the marker.
func TestDemoCapture(t *testing.T) {
	for _, wm := range []string{"0", "64kB", "256kB", "64MB"} {
		t.Run(wm, func(t *testing.T) {
			if err := runDemo(context.Background(), []string{"-capture", "-work-mem", wm}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestDemoLive runs the demo as the README's first command does, on a throwaway server when one is
// installed (runDemo falls back to the capture otherwise, which must succeed too). It compares the
// rows received with the table.
func TestDemoLive(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	if err := runDemo(context.Background(), []string{"-rows", "300", "-savepoints", "6", "-work-mem", "64kB"}); err != nil {
		t.Fatal(err)
	}
}
