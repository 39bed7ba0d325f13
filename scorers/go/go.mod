module github.com/replaylab/replaylab/scorers/go

go 1.19
