from examples.client_agent import main

main()
