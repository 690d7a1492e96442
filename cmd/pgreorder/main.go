// Command pgreorder demonstrates, records and replays pgoutput streams.
package main

func main() {}
