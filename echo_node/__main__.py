from echo_node.cli import main

main()
