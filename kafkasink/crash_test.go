package kafkasink_test

const crashConsumerEnv = "PGREORDER_KAFKASINK_CRASH"

func crashConsumer(spec string) int { return 2 }
