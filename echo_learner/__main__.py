from echo_learner.cli import main

main()
