import { freshDatabase } from '../helpers/testDatabase.ts'
import { describeCatalogue } from './catalogue.suite.ts'

describeCatalogue('a Postgres server', freshDatabase)
