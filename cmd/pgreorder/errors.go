package main

// explain returns the message of err as the command's user should read it.
func explain(command string, err error) string {
	return err.Error()
}
