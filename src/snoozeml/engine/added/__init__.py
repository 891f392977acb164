"""Models added and removed at run time: the repository load with a path, and ModelMesh's SPI."""
