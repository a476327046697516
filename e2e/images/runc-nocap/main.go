// Command runc-nocap is the OCI runtime of the Docker daemon that the end-to-end scripts start.
// This machine's processes lack CAP_SYS_RESOURCE, so runc fails to start a container whose spec
// asks for it (every privileged container does). Before `create` and `run`, it removes that
// capability from the bundle's config.json, then hands over to runc with the same arguments.
// `docker exec --privileged` (kind runs every command in its nodes so) asks for it too: before
// `exec --process FILE`, it removes it from that process JSON as well.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

const dropped = "CAP_SYS_RESOURCE"

func main() {
	runc, err := lookRunc()
	if err == nil {
		err = stripBundle(os.Args[1:])
	}
	if err == nil {
		err = syscall.Exec(runc, append([]string{"runc"}, os.Args[1:]...), os.Environ())
	}
	fmt.Fprintln(os.Stderr, "runc-nocap:", err)
	os.Exit(1)
}

func lookRunc() (string, error) {
	for _, p := range []string{"/usr/sbin/runc", "/usr/bin/runc"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("runc not found")
}

// stripBundle edits the bundle's config.json when the command creates a container, and the
// process JSON when it executes a process in one.
func stripBundle(args []string) error {
	command, bundle, processFile := "", ".", ""
	for i := 0; i < len(args); i++ {
		switch a := args[i]; a {
		case "create", "run", "exec":
			if command == "" {
				command = a
			}
		case "--bundle", "-b":
			if i+1 < len(args) {
				bundle = args[i+1]
				i++
			}
		case "--process", "-p":
			if i+1 < len(args) {
				processFile = args[i+1]
				i++
			}
		}
	}
	switch {
	case command == "exec" && processFile != "":
		return stripFile(processFile, func(doc map[string]any) map[string]any { return doc })
	case command == "create" || command == "run":
		return stripFile(filepath.Join(bundle, "config.json"), func(doc map[string]any) map[string]any {
			process, _ := doc["process"].(map[string]any)
			return process
		})
	}
	return nil
}

// stripFile removes the dropped capability from every set of the process that locate finds in
// the JSON document at path.
func stripFile(path string, locate func(map[string]any) map[string]any) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return err
	}
	process := locate(doc)
	caps, _ := process["capabilities"].(map[string]any)
	for set, list := range caps {
		names, _ := list.([]any)
		kept := make([]any, 0, len(names))
		for _, n := range names {
			if n != dropped {
				kept = append(kept, n)
			}
		}
		caps[set] = kept
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o644)
}
