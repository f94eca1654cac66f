// Package secret reads a group secret or key for AUTH and ENCRYPT: from a
// file, or else from an environment variable, never from a stack config.
package secret

import (
	"fmt"
	"os"
)

// Read returns the contents of file, or if file is empty the value of the
// environment variable env. fileKey and envKey name the config keys in
// errors ("secret_file", "secret_env").
func Read(file, env, fileKey, envKey string) (string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("%s: %w", fileKey, err)
		}
		return string(b), nil
	}
	v, ok := os.LookupEnv(env)
	if !ok {
		return "", fmt.Errorf("%s: %s is not set", envKey, env)
	}
	return v, nil
}
